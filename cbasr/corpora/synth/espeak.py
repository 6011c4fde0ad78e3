"""eSpeak NG driven through ``ctypes`` from the library and data of the ``espeakng-loader`` wheel.

The binding follows ``speak_lib.h`` of eSpeak NG 1.52 (the version the wheel ships):

- ``espeak_Initialize(AUDIO_OUTPUT_SYNCHRONOUS, 0, data_path, espeakINITIALIZE_PHONEME_EVENTS)``
  returns the output sample rate (22050 Hz);
- ``espeak_SetSynthCallback`` installs a callback that receives each chunk of 16-bit samples
  together with a list of ``espeak_EVENT`` records terminated by ``espeakEVENT_LIST_TERMINATED``;
- ``espeak_Synth`` runs synchronously: when it returns, the callback has seen the whole utterance.

Phoneme events carry the phoneme mnemonic (with its stress mark, e.g. ``'aU``) in the ``id``
union and the position of the phoneme's first output sample in ``sample`` (samples at the
output rate, counted from the start of the message).

The library keeps global state (current voice, parameters, callback, and waveform-generator
state that outlives ``espeak_Terminate``), so there is one engine per process:
:func:`espeak_engine` creates it on first use and returns the same object after, and
:meth:`EspeakEngine.reset` reloads the library to get back to a fresh process's state.
Parallel synthesis uses worker processes, each with its own engine.
"""

import _ctypes
import ctypes
from dataclasses import dataclass

import espeakng_loader
import numpy as np

__all__ = ["EspeakEngine", "EspeakError", "Synthesis", "espeak_engine"]

# speak_lib.h constants.
_AUDIO_OUTPUT_SYNCHRONOUS = 2
_INITIALIZE_PHONEME_EVENTS = 0x0001
_POS_CHARACTER = 1
_CHARS_UTF8 = 1
_EVENT_LIST_TERMINATED = 0
_EVENT_PHONEME = 7
_PARAM_RATE = 1
_PARAM_PITCH = 3
_PARAM_RANGE = 4
_EE_OK = 0

_unload_library = getattr(_ctypes, "dlclose", None) or _ctypes.FreeLibrary


class _EventId(ctypes.Union):
    """The ``id`` union of ``espeak_EVENT``: 8 bytes, pointer-aligned."""

    _fields_ = [
        ("number", ctypes.c_int),  # WORD and SENTENCE events
        ("name", ctypes.c_char_p),  # MARK and PLAY events
        ("string", ctypes.c_char * 8),  # PHONEME events: mnemonic, NUL-terminated unless 8 bytes
    ]


class _Event(ctypes.Structure):
    """``espeak_EVENT``: 40 bytes on 64-bit platforms, ``id`` at offset 32."""

    _fields_ = [
        ("type", ctypes.c_int),  # espeak_EVENT_TYPE
        ("unique_identifier", ctypes.c_uint),
        ("text_position", ctypes.c_int),  # characters from the start of the text
        ("length", ctypes.c_int),  # word length in characters (WORD events)
        ("audio_position", ctypes.c_int),  # milliseconds within the output
        ("sample", ctypes.c_int),  # sample index within the output
        ("user_data", ctypes.c_void_p),
        ("id", _EventId),
    ]


# int SynthCallback(short *wav, int numsamples, espeak_EVENT *events)
_SynthCallback = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.POINTER(_Event)
)


class EspeakError(RuntimeError):
    """An eSpeak NG call failed."""


@dataclass(frozen=True)
class Synthesis:
    """One synthesized utterance at the engine's output rate.

    Attributes:
        audio: ``(N,)`` int16 samples at ``sample_rate``.
        sample_rate: samples per second (22050 for eSpeak NG).
        phones: raw phoneme mnemonics in order, stress marks and pauses included.
        phone_samples: the first output sample of each phone, same length as ``phones``.
    """

    audio: np.ndarray
    sample_rate: int
    phones: tuple[str, ...]
    phone_samples: tuple[int, ...]


class EspeakEngine:
    """The process's eSpeak NG engine; obtain it with :func:`espeak_engine`."""

    def __init__(self, library_path: str, data_path: str):
        self._library_path = library_path
        self._data_path = data_path
        self._chunks: list[bytes] = []
        self._events: list[tuple[str, int]] = []
        # Keep a reference: the C library holds only the raw function pointer.
        self._callback = _SynthCallback(self._on_synth)
        self._load()

    def _load(self) -> None:
        self._lib = ctypes.CDLL(self._library_path)
        self._declare_signatures()
        rate = self._lib.espeak_Initialize(
            _AUDIO_OUTPUT_SYNCHRONOUS, 0, self._data_path.encode(), _INITIALIZE_PHONEME_EVENTS
        )
        if rate <= 0:
            raise EspeakError(f"espeak_Initialize failed with data path {self._data_path!r}")
        self.sample_rate = int(rate)
        self.version = self._lib.espeak_Info(None).decode()
        self._lib.espeak_SetSynthCallback(self._callback)

    def reset(self) -> None:
        """Unload and reload the library, returning eSpeak to the state of a fresh process.

        eSpeak's waveform generator keeps static state that neither ``espeak_Terminate`` nor
        a voice change clears (for instance the phase of the pitch flutter), so an
        utterance's samples depend on what the process synthesized before. Unloading the
        library (``dlclose``) and loading it again makes the output a function of the calls
        made since the reset only (its cost: recipes/synth/RESULTS.md, "Measurements behind
        defaults").
        """
        self._lib.espeak_Terminate()
        _unload_library(self._lib._handle)
        self._load()

    def _declare_signatures(self) -> None:
        lib = self._lib
        lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        lib.espeak_Initialize.restype = ctypes.c_int
        lib.espeak_Info.argtypes = [ctypes.POINTER(ctypes.c_char_p)]
        lib.espeak_Info.restype = ctypes.c_char_p
        lib.espeak_SetSynthCallback.argtypes = [_SynthCallback]
        lib.espeak_SetSynthCallback.restype = None
        lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
        lib.espeak_SetVoiceByName.restype = ctypes.c_int
        lib.espeak_SetParameter.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
        lib.espeak_SetParameter.restype = ctypes.c_int
        lib.espeak_ng_SetRandSeed.argtypes = [ctypes.c_long]
        lib.espeak_ng_SetRandSeed.restype = None
        lib.espeak_Synth.argtypes = [
            ctypes.c_void_p,  # text
            ctypes.c_size_t,  # size in bytes, including the terminator
            ctypes.c_uint,  # position
            ctypes.c_int,  # position_type
            ctypes.c_uint,  # end_position
            ctypes.c_uint,  # flags
            ctypes.POINTER(ctypes.c_uint),  # unique_identifier
            ctypes.c_void_p,  # user_data
        ]
        lib.espeak_Synth.restype = ctypes.c_int

    def _on_synth(self, wav, num_samples: int, events) -> int:
        if num_samples > 0:
            # a copy of the chunk's bytes, not a numpy view through a new ctypes array type
            # (recipes/synth/RESULTS.md, "Measurements behind defaults")
            self._chunks.append(ctypes.string_at(wav, ctypes.sizeof(ctypes.c_short) * num_samples))
        i = 0
        while events[i].type != _EVENT_LIST_TERMINATED:
            event = events[i]
            if event.type == _EVENT_PHONEME:
                self._events.append((event.id.string.decode("utf-8", "replace"), event.sample))
            i += 1
        return 0  # continue synthesis

    def set_voice(self, voice: str, variant: str | None = None) -> None:
        """Select a voice (``"en-us"``) and optional variant from ``voices/!v`` (``"m3"``)."""
        name = voice if variant is None else f"{voice}+{variant}"
        status = self._lib.espeak_SetVoiceByName(name.encode())
        if status != _EE_OK:
            raise EspeakError(f"espeak_SetVoiceByName({name!r}) failed with status {status}")

    def set_prosody(self, rate: int, pitch: int, pitch_range: int) -> None:
        """Set speaking rate (words per minute), pitch (0..99) and pitch range (0..99).

        They persist across voice changes, so callers set all three for every speaker.
        """
        for parameter, value in (
            (_PARAM_RATE, rate),
            (_PARAM_PITCH, pitch),
            (_PARAM_RANGE, pitch_range),
        ):
            status = self._lib.espeak_SetParameter(parameter, int(value), 0)
            if status != _EE_OK:
                raise EspeakError(
                    f"espeak_SetParameter({parameter}, {value}) failed with status {status}"
                )

    def synthesize(self, text: str, seed: int = 0) -> Synthesis:
        """Synthesize ``text`` with the current voice; ``seed`` fixes eSpeak's noise generator."""
        self._chunks, self._events = [], []
        self._lib.espeak_ng_SetRandSeed(seed)
        data = text.encode("utf-8") + b"\0"
        status = self._lib.espeak_Synth(
            data, len(data), 0, _POS_CHARACTER, 0, _CHARS_UTF8, None, None
        )
        if status != _EE_OK:
            raise EspeakError(f"espeak_Synth failed with status {status} for {text!r}")
        audio = np.frombuffer(b"".join(self._chunks), dtype=np.int16).copy()
        phones = tuple(label for label, _ in self._events)
        samples = tuple(sample for _, sample in self._events)
        self._chunks, self._events = [], []
        return Synthesis(audio, self.sample_rate, phones, samples)


_ENGINE: EspeakEngine | None = None


def espeak_engine() -> EspeakEngine:
    """Return this process's engine, initialising eSpeak NG from the wheel on first use."""
    global _ENGINE
    if _ENGINE is None:
        _ENGINE = EspeakEngine(espeakng_loader.get_library_path(), espeakng_loader.get_data_path())
    return _ENGINE
