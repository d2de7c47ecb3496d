"""Docs target: placeholder replaced below."""


def outputs(spec):
    return []
