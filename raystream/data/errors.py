"""The one exception of raystream.data: bad input (a file, a key) named together with what is wrong with it."""


class DataError(ValueError):
    """A video, manifest, directory or data/stream key that cannot be used; the message names it and the problem."""
