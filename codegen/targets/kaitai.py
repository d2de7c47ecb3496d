"""kaitai target: being written."""


def outputs(spec):
    return []
