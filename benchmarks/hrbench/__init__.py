"""The benchmark suite behind ``benchmarks/suite.py`` (``make bench``).

One run measures, on one machine and in this order: the machine's limits
(``limits``), the peers NATS JetStream and Redis Streams (``peer_nats``,
``peer_redis``), the Python floor (``floor``) and headrace (``hr_shapes``),
each shape with the same clients where it applies. Rows are ``results.Row``
records; ``render`` turns a run's results into tables and judges the targets.
``docs/benchmarks.md`` says what each shape measures.
"""
