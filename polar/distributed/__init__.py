"""Ray plumbing shared by the Ray backend: cluster connection, resource checks, the replay store.

Nothing here imports ``ray`` at module import time; algorithms and configs never import this.
"""

from polar.distributed.cluster import ClusterHandle, RoleRequest, check_placeable, connect, wait_ready

__all__ = ["ClusterHandle", "RoleRequest", "check_placeable", "connect", "wait_ready"]
