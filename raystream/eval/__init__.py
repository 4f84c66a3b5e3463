"""raystream.eval"""
