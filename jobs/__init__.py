"""Command entry points (``mdd <command>`` runs ``jobs.<command>.main``)."""

WAIT_HELP = "when another mdd run is writing the same --out, wait for it to finish (default: exit 2 naming it)"


def add_wait_flag(parser) -> None:
    """``--wait``: every command that writes under an output folder holds its lock (mdd.storage.run_lock)."""
    parser.add_argument("--wait", action="store_true", help=WAIT_HELP)
