"""A multi-node synthesis on one machine, run by ``tests/test_multinode.py`` in its own process.

    python tests/multinode_run.py CASES OUT REPORT_JSON

``ray.cluster_utils.Cluster`` starts a head node (no GPU) and two worker nodes with one fake GPU
each. The vLLM pool starts one engine actor per GPU (``num_gpus_per_engine: 1``) hosting the
scripted engine (``engine.vllm.hosted``), dialogue workers are spread over the nodes, and once the
first shard is written the node of the second engine is removed: its engine and its dialogue
workers die with it. The report (JSON) holds the node of each engine and worker, the GPU nodes,
the removed node and the run's counts; the test checks the output itself.
"""
from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import ray
from ray.cluster_utils import Cluster

ROOT = Path(__file__).resolve().parents[1]


def main(cases: str, out: str, report: str) -> int:
    from mdd.config import load_config
    from mdd.synthesize.run import run_synthesis
    from mdd.engines.base import launch_engine
    from mdd.storage import Store

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "num_gpus": 0})
    gpu_nodes = [cluster.add_node(num_cpus=1, num_gpus=1) for _ in range(2)]
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        cfg = load_config(ROOT / "configs" / "local.yaml", {
            "engine.name": "vllm", "engine.model": "scripted", "engine.vllm.hosted": "scripted",
            "engine.vllm.num_engines": 2, "engine.vllm.num_gpus_per_engine": 1, "engine.vllm.num_cpus_per_engine": 0,
            "engine.vllm.stats_refresh_s": 0.5,
            "synth.cases": cases, "synth.out": out, "synth.variants": 3, "synth.shard_size": 6,
            "synth.in_flight": 16, "synth.num_workers": 4, "synth.max_attempts": 8, "synth.retry_backoff_s": 0.2,
        })
        engine = launch_engine(cfg.engine)
        engine_nodes = [i["node"] for i in engine.launch_info]
        victim = next(n for n in gpu_nodes if n.node_id == engine_nodes[1])
        removed: dict[str, float] = {}

        def remove_when_started() -> None:
            store = Store(out)
            while not store.files("synth", ".parquet"):
                time.sleep(0.05)
            removed["victim_requests"] = ray.get(engine.actors[1].stats.remote())["requests"]
            cluster.remove_node(victim, allow_graceful=False)
            removed["at"] = time.time()

        killer = threading.Thread(target=remove_when_started, daemon=True)
        killer.start()
        summary = run_synthesis(cfg, engine=engine, progress=False)
        killer.join(timeout=60)
        survivor = ray.get(engine.actors[0].stats.remote())
        engine.shutdown()
        Path(report).write_text(json.dumps({
            "gpu_nodes": [n.node_id for n in gpu_nodes], "head": cluster.head_node.node_id,
            "engine_nodes": engine_nodes, "removed": victim.node_id, "removed_after_requests": removed.get("victim_requests"),
            "survivor_requests": survivor["requests"], "counts": summary["counts"],
            "placement": summary["placement"], "engine": summary["engine"]["name"],
        }, indent=2))
    finally:
        ray.shutdown()
        cluster.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
