"""The streaming service's settings, each declared once with its default and description:
`ServiceConfig`, the loop's (for a `Service` built in code), and `ServeSettings`, all that
`streamgnn serve` takes (those and the model, data, Kafka, REST and MPI ones). The
command's flags and env vars take their defaults and help texts from here."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field, model_validator

from streamgnn.stream.schemas import Topics
from streamgnn.stream.transport import OffsetReset
from streamgnn.updates import ValueLimits


class ServiceConfig(BaseModel):
    batch_size: int = Field(1000, ge=1, description="Updates per batch.")
    max_wait_s: float = Field(0.05, ge=0, description="Seconds before a partial batch is "
                              "applied.")
    arrival_wait_s: float = Field(2.0, ge=0, description="Seconds an update naming a vertex "
                                  "that has not arrived waits for it.")
    checkpoint_batches: int = Field(50, ge=1, description="Checkpoint every N batches ...")
    checkpoint_s: float = Field(30.0, gt=0, description="... or every this many seconds.")
    max_abs_feature: float = Field(
        ValueLimits.features, gt=0, description="Largest |feature value| accepted; larger "
        "ones are dead-lettered as out_of_range (past ~1e9 for |weight x feature| float "
        "cancellation would break exactness).")
    max_abs_weight: float = Field(ValueLimits.weights, gt=0,
                                  description="Largest |edge weight| accepted.")
    quarantine_after: int = Field(
        2, ge=1, description="Deaths of the service with one update alone in flight "
        "before that update is dead-lettered as quarantined.")
    payload_bytes: int = Field(64 << 10, ge=256, le=512 << 10, description="dead letters "
                               "carry at most this much of the bad input")
    topics: Topics = Topics()


class ServeSettings(ServiceConfig):
    """Everything `streamgnn serve` takes; ``topics`` follows ``topic_prefix``."""

    checkpoint: Path = Field(Path("artifacts/model.pt"), description="Model from `train` "
                             "(bootstrapped when no service state exists; where state "
                             "exists and this file does too, it must be the model the "
                             "state serves).")
    dataset: str = Field(
        "arxiv-like", description="Synthetic preset (tiny, small, arxiv-like, "
        "products-like), a .npz written by `streamgnn datasets generate`, or an OGB node "
        "dataset directory.")
    holdout: float = Field(
        0.2, description="Fraction of vertices held out of the snapshot as the update "
        "stream (RIPPLE++ protocol: 0.2). 0 uses the whole graph.")
    seed: int = Field(0, description="Seed for generation and splits.")
    state_dir: Path = Field(Path("runs/serve"), description="Service checkpoints; a restart "
                            "resumes from the last one.")
    rebuild_state: bool = Field(
        False, description="When no checkpoint in --state-dir verifies (all corrupt), "
        "bootstrap a new state there from the model and what the updates topic still "
        "holds, instead of refusing to start; its label changes carry a new epoch in "
        "their event ids, so none reuses an old id.")
    partitions: int = Field(1, description="Split the engine's state into P partitions (in "
                            "this process; same answers for every P).")
    placement: str = Field(
        "metis", description="Initial owners: metis (METIS over the whole graph), stream "
        "(Fennel, one pass over the vertices in id order: for a graph too large for METIS) "
        "or hash (id mod P). A new vertex joins the high in-degree vertex its first edge "
        "goes into, else the least-loaded partition (by id mod P with hash).")
    partitions_from: Path | None = Field(
        None, description="Bootstrap from the partition files `streamgnn datasets partition` "
        "wrote into this folder, each partition from its own file (with --workers, on its "
        "rank; rank 0 reads the map alone), instead of --dataset loaded here; the folder "
        "sets the partitions and their placement.")
    until_idle: float | None = Field(None, description="Exit after this many seconds "
                                     "without input (default: run until Ctrl-C).")
    workers: int = Field(
        0, description="Run the partitions on N MPI worker ranks: starts `mpiexec -n N+1` "
        "(rank 0 serves the stream, ranks 1..N hold one partition each) and restarts the "
        "job from its last checkpoint if any rank dies. 0: one process.")
    max_restarts: int = Field(3, description="With --workers: restarts of a failed job "
                              "(backoff 1, 2, 4 ... s) before giving up.")
    bootstrap_servers: str = Field("127.0.0.1:19092", description="Kafka brokers "
                                   "(host:port,...); the default is the embedded broker.")
    kafka_config: Path | None = Field(
        None, description="Kafka client settings for a production cluster: key=value lines "
        "(security.protocol=SASL_SSL, sasl.mechanism=PLAIN, ssl.cafile=..., client.id=...); "
        "`STREAMGNN_KAFKA_<SETTING>` variables override them.")
    topic_prefix: str = Field("", description="Prefix of every topic name (graph-updates, "
                              "label-changes, dead-letters, ...).")
    offset_reset: OffsetReset = Field(
        "refuse", description="Where to resume a partition of the input topics whose "
        "checkpointed offset the broker no longer holds (the topic was recreated, or "
        "truncated by retention): refuse (do not start; name the partition and its "
        "offsets), earliest (from the oldest record it holds) or latest (from its end: "
        "only records produced from now on). A warning names each partition moved. An "
        "offset found out of range while serving stops the service; this applies when it "
        "starts again.")
    device: str = Field("cpu", description="torch device for dense work: cpu or cuda.")
    calibration: Path = Field(
        Path.home() / ".streamgnn" / "calibration.json", description="Query executor "
        "thresholds written by `streamgnn calibrate` (serve: used when the file exists; "
        "without it query batches run on --device).")
    http: str = Field(
        "127.0.0.1:8080", description="Serve the REST API (embeddings, labels, neighbors, "
        "queries, status, /metrics, /healthz, /readyz; OpenAPI at /docs) on HOST:PORT, "
        "or off.")
    http_token: str | None = Field(
        None, description="Bearer token every /v1 and /metrics request must send "
        "(Authorization: Bearer TOKEN); required beyond loopback.")
    torch_threads: int | None = Field(
        None, ge=0, description="Threads torch runs a batch's dense work on, in each "
        "process. Default: OMP_NUM_THREADS if set, else 1: a batch's hundreds of small "
        "operations each wait for every thread, and on cores shared with the REST server, "
        "the Kafka client or other processes more threads run slower (see README, "
        "Threads). 0: torch's default, one per core.")

    @model_validator(mode="after")
    def _prefixed_topics(self) -> ServeSettings:
        self.topics = Topics.prefixed(self.topic_prefix)
        return self


SERVE = ServeSettings()  # the defaults
