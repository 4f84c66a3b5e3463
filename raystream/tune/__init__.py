"""raystream.tune"""
