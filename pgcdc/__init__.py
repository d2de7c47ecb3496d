"""pgcdc: change data capture from PostgreSQL's logical replication stream.

Layers, each usable alone and knowing only the one below it:

- wire: the generated codecs (``pgoutput_codec``, ``replication_codec``) and their runtime
  (``pgcdc.runtime``);
- stream: reading a replication slot into capture files, with acknowledgements and resume;
- events: relations, typed values and transactions, giving change events;
- sinks: JSON Lines, Parquet and Spark.
"""

from pgcdc._moved import install as _install_moved
from pgcdc.lsn import format_lsn, parse_lsn

_install_moved()  # old import paths of moved modules (pgcdc.runtime.spark_arrow, ...): _moved

__all__ = ["format_lsn", "parse_lsn"]
