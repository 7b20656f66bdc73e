"""Several ``headrace serve`` nodes as one service, coordinated by ZooKeeper.

Module map (``docs/cluster.md``):

* ``layout.py``: the znode layout under the cluster's chroot, the JSON
  records and the ``--cluster`` URL; pure (``docs/cluster.md#layout``).
* ``placement.py``: where the leader puts containers; pure
  (``docs/cluster.md#placement``).
* ``member.py``: ``ClusterMember``, one node's membership: registration,
  leader election, claims and hand-overs, fencing (``docs/cluster.md#moves``,
  ``docs/cluster.md#fencing``).
* ``_zk.py``: kazoo behind coroutines, its callbacks handed to the loop.
* ``errors.py``: ``ClusterError`` and its leaves.
* ``remote.py``: ``RemoteStore``, the store of another node over the segment-store wire.
* ``routing.py``: ``RoutedStore``, each segment to the local store or its owner's.
* ``metadata.py``: ``ClusterModel``, the controller metadata written by the
  leader alone, followed by every other node (``docs/cluster.md#metadata``).
* ``secret.py``: the cluster secret kept in ZooKeeper (``docs/cluster.md#secret``).
* ``admin.py``: what ``headrace cluster status|drain|undrain`` ask of a node,
  answered from its member's view (``docs/cluster.md#cli``).

Only ``server`` and ``cli`` import this package (``tests/test_architecture.py``).
Nothing is imported here, so reading the configuration does not load kazoo.
"""
