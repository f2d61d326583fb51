"""What the ``streamgnn`` command's modules share: option types whose help (and, for
`serve`, defaults) come from `ServeSettings`, the console, tables, and the topic names and
Kafka client settings given by flags."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from streamgnn.settings import SERVE, ServeSettings

if TYPE_CHECKING:
    from streamgnn.stream import Topics
    from streamgnn.stream.kafka_config import KafkaConfig

console = Console()


def setting(name: str, *flags: str, **option: Any) -> Any:
    """The typer option of the serve setting ``name``: its help is the setting's
    description (`ServeSettings`); its default is given where it is used."""
    return typer.Option(*flags, help=ServeSettings.model_fields[name].description, **option)


DatasetOpt = Annotated[str, setting("dataset", "--dataset", "-d", envvar="STREAMGNN_DATASET")]
SeedOpt = Annotated[int, setting("seed", "--seed", envvar="STREAMGNN_SEED")]
HoldoutOpt = Annotated[float, setting("holdout", "--holdout")]
PlacementOpt = Annotated[str, setting("placement", "--placement", envvar="STREAMGNN_PLACEMENT")]
DeviceOpt = Annotated[str, setting("device", "--device", envvar="STREAMGNN_DEVICE")]
BootstrapOpt = Annotated[str, setting("bootstrap_servers", "--bootstrap-servers", "-b",
                                      envvar="STREAMGNN_BOOTSTRAP_SERVERS")]
KafkaConfigOpt = Annotated[Path | None, setting("kafka_config", "--kafka-config",
                                                envvar="STREAMGNN_KAFKA_CONFIG")]
TopicPrefixOpt = Annotated[str, setting("topic_prefix", "--topic-prefix",
                                        envvar="STREAMGNN_TOPIC_PREFIX")]
BrokerDirOpt = Annotated[Path, typer.Option(
    "--state-dir", envvar="STREAMGNN_BROKER_DIR", help="Pid file and log of the broker.")]
BrokerPortOpt = Annotated[int, typer.Option("--port", envvar="STREAMGNN_BROKER_PORT",
                                            help="Port of the embedded broker.")]
DEFAULT_BOOTSTRAP = SERVE.bootstrap_servers
DEFAULT_BROKER_DIR = Path.home() / ".streamgnn" / "broker"
DEFAULT_CALIBRATION = SERVE.calibration
CalibrationOpt = Annotated[Path, setting("calibration", "--calibration",
                                         envvar="STREAMGNN_CALIBRATION")]


def print_table(table: Table) -> None:
    """``table`` below its title as a line of its own: a title wider than the table's
    columns stays one line instead of wrapping into their width."""
    from rich.text import Text

    if table.title:
        console.print(Text(str(table.title), style="bold"), soft_wrap=True)
        table.title = None
    console.print(table)


def topic_names(prefix: str) -> Topics:
    from streamgnn.stream import Topics

    return Topics.prefixed(prefix)


def kafka_settings(bootstrap_servers: str, file: Path | None) -> KafkaConfig:
    """The brokers and the client settings from ``file`` and ``STREAMGNN_KAFKA_*``."""
    from streamgnn.errors import KafkaConfigError
    from streamgnn.stream.kafka_config import KafkaConfig

    try:
        return KafkaConfig.load(bootstrap_servers, file)
    except KafkaConfigError as e:
        raise typer.BadParameter(str(e), param_hint="--kafka-config / STREAMGNN_KAFKA_*"
                                 ) from None
