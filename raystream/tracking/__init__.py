"""raystream.tracking"""
