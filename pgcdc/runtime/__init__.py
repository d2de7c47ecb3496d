"""The runtime of the generated codecs: everything that does not depend on a spec.

Generated packages (``pgoutput_codec``, ``replication_codec``, ...) hold only what their spec
determines (message classes, per-message decoders and encoders, tables) and import the rest
from here, as betterproto's generated modules import betterproto.
"""
