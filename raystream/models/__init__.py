"""raystream.models"""
