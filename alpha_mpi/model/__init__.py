"""Model layer: trees, coverage, topologies, delivery and payload layouts. Pure Python."""

from .coverage import OrderedMembers, ParticipantGroup, check_coverage  # noqa: F401
from .delivery import DeliverTo, ReplicateAll  # noqa: F401
from .layout import Layout  # noqa: F401
from .topology import block_owners, build, classify, hierarchy, parse_topology, star  # noqa: F401
from .tree import Branch, Leaf, Node, expression, leaf_sequence, postorder  # noqa: F401
