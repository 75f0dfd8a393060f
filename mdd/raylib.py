"""Starting or joining Ray, the same way from every job."""
from __future__ import annotations

import os
from typing import Any


def init_ray(cfg: Any) -> None:
    """Join the cluster named by ``cfg.address`` or ``RAY_ADDRESS``; else start a local Ray.

    ``cfg`` is a ``mdd.config.RayConfig``. Idempotent.
    """
    import ray

    from mdd import signals

    if ray.is_initialized():
        return
    address = cfg.address or os.environ.get("RAY_ADDRESS")
    kwargs: dict[str, Any] = {"ignore_reinit_error": True, "log_to_driver": True}
    if address:
        ray.init(address=address, **kwargs)
    else:
        ray.init(
            address="local",  # a new local instance: never join a cluster another process left in /tmp/ray
            num_cpus=cfg.num_cpus,
            include_dashboard=cfg.include_dashboard,
            **kwargs,
        )
    signals.install()  # after ray.init, which installs its own (sys.exit) handler
