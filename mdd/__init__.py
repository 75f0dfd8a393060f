"""mdd: neuro-symbolic synthesis of Chinese psychiatric diagnostic dialogues (MDD-5k method) at scale."""

__version__ = "0.1.0"
