"""raystream.data"""
