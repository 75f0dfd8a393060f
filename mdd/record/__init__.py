"""The bottom floor every stage stands on: the typed dialogue record, what an exchange is, and how
the speakers' speech is measured (``mdd.record.speech``). Imports nothing of the project above
``mdd.schema`` and ``mdd.knowledge``."""
from mdd.record.dialogue import DialogueRecord
from mdd.record.turns import (
    ANSWERERS,
    DOCTOR,
    SPEAKERS,
    Exchange,
    Round,
    Turn,
    count_exchanges,
    doctor_turns,
    exchanges,
    rounds,
    speaker_of,
)

__all__ = ["ANSWERERS", "DOCTOR", "SPEAKERS", "DialogueRecord", "Exchange", "Round", "Turn", "count_exchanges",
           "doctor_turns", "exchanges", "rounds", "speaker_of"]
