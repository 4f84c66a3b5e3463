"""raystream.optim"""
