"""raystream.train"""
