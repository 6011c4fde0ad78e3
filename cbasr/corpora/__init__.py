"""Corpus preparation: corpora that cbasr can make or import (``synth``: synthetic eSpeak speech)."""
