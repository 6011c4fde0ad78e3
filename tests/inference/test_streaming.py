"""Streaming greedy decoding of transducers: the final hypothesis is the offline one, however
the features arrive; partial hypotheses only grow; refusals name the reason."""

import itertools

import pytest
import soundfile
import torch

from cbasr import Recognizer, builder
from cbasr.cli import transcribe
from cbasr.data.features import write_feature_settings
from cbasr.inference.streaming import TransducerStream, emission_seconds, streamable
from cbasr.training.options import fbank_options_of
from tests.inference.fake_experiment import make_experiment, make_streaming_experiment
from tests.search import tiny

ULSTM = {**tiny.ENCODER, "bidirectional": False, "num_layers": 2}
# a chunked Conformer: chunks of 3 frames, 2 of left context, causal convolutions
CHUNKED = {
    "name": "conformer",
    "d_model": 8,
    "num_heads": 2,
    "ffn_dim": 16,
    "num_layers": 2,
    "kernel_size": 3,
    "dropout": 0.0,
    "subsampling": "stack",
    "stack": 2,
    "stride": 2,
    "chunk_size": 3,
    "left_chunks": 2,
}

# the same with chunk-wise convolutions (the rest of the chunk seen, as by the attention)
CHUNK_CONV = {**CHUNKED, "kernel_size": 5, "chunk_conv": "chunk"}


def _model(decoder: str, options: dict | None = None, encoder: dict = ULSTM):
    """A tiny random transducer over a unidirectional encoder, emitting now and then."""
    torch.manual_seed(5)
    loss = {"name": tiny.LOSS[decoder], **(options or {})}
    model = builder.build_model(encoder, tiny.DECODERS[decoder], loss, tiny.FEATS, tiny.VOCAB)
    model = model.double().eval()
    feats, lens = tiny.batch(seed=6, lengths=(23, 17, 9, 4, 30))
    feats = feats.double()
    tiny.emit_about_a_third(model, feats, lens)
    return model, feats, lens


CASES = [
    ("transducer", {}),
    ("transducer", {"topology": "monotonic", "greedy": "emission"}),
    ("hat", {}),
    ("hat_linear", {"topology": "monotonic"}),
    ("hat_context1", {}),
]


@pytest.mark.parametrize("pieces", [[1], [2, 3, 5], [7], [1000]])
@pytest.mark.parametrize(
    "decoder,options,encoder",
    [(*case, ULSTM) for case in CASES]
    + [("hat", {}, CHUNKED), ("transducer", {}, CHUNKED), ("hat", {}, CHUNK_CONV)],
)
def test_the_final_hypothesis_is_the_offline_one_however_the_features_arrive(
    decoder, options, encoder, pieces
):
    model, feats, lens = _model(decoder, options, encoder)
    with torch.no_grad():
        offline = model.greedy_decode(feats, lens)
    assert 0 < sum(map(len, offline))
    for b, n in enumerate(lens.tolist()):
        stream, start, partials = TransducerStream(model), 0, []
        for size in itertools.cycle(pieces):
            if start >= n:
                break
            partials.append(list(stream.accept(feats[b, start : min(start + size, n)])))
            start += size
        final = stream.finish()
        assert final == offline[b]
        for before, after in zip(partials, partials[1:] + [final]):
            assert after[: len(before)] == before  # nothing decided is revised
        frames = [frame for _, frame in stream.emissions]
        assert frames == sorted(frames) and all(0 <= f < -(-n // 2) for f in frames)
        with torch.no_grad():  # the batch search's frames are the stream's
            found = model.greedy_emissions(feats[b : b + 1, :n], lens[b : b + 1])
        assert found == ([final], [frames])
        assert stream.frames == -(-n // 2)  # every encoder frame of the offline encoder


def test_what_does_not_stream_is_refused_with_the_reason():
    model, feats, _ = _model("hat")
    bidirectional, _, _ = _model("hat", encoder={**ULSTM, "bidirectional": True})
    assert "unidirectional recurrent encoder (encoder=ulstm)" in streamable(bidirectional)
    with pytest.raises(ValueError, match=r"RNNEncoder: streaming needs"):
        TransducerStream(bidirectional)
    full = _model("hat", encoder={**CHUNKED, "chunk_size": 0})[0]
    assert "or a chunked Conformer (encoder.chunk_size > 0)" in streamable(full)
    conv = builder.build_model(
        {**CHUNKED, "subsampling": "conv"}, tiny.DECODERS["hat"], {"name": "hat"}, 40, 5
    )
    assert "Conv2dSubsampling: streaming needs frame stacking" in streamable(conv)
    cb = tiny.build("pointwise")
    assert "streaming decodes RNN-T and HAT models" in streamable(cb)
    stream = TransducerStream(model)
    stream.accept(feats[0, :5])
    stream.finish()
    assert stream.finish() == stream.hypothesis  # finishing twice changes nothing
    with pytest.raises(RuntimeError, match="this stream is finished"):
        stream.accept(feats[0, 5:8])


@pytest.mark.parametrize("decoder,loss", [("hat", "hat"), ("transducer", "rnnt")])
def test_a_recognizer_stream_of_audio_pieces_ends_on_the_offline_transcription(
    decoder, loss, tone_data, tmp_path
):
    """Audio fed in pieces of 100 ms and of an odd 777 samples: features frame by frame as
    their windows complete, the final transcription the recogniser's offline one, partial
    ones only growing, every token's emission time inside the audio."""
    exp_dir = make_experiment(
        tmp_path / "exp", tone_data, decoder, loss, encoder={"bidirectional": False}
    )
    write_feature_settings(exp_dir, fbank_options_of(tone_data / "fbank/train", 40), True)
    recognizer = Recognizer.from_pretrained(exp_dir)
    wavs = sorted((tone_data / "corpus/wav/test").glob("*.wav"))[:4]
    feats = [recognizer.features_of(w) for w in wavs]
    lens = torch.tensor([f.shape[0] for f in feats])
    padded = torch.nn.utils.rnn.pad_sequence(feats, batch_first=True)
    tiny.emit_about_a_third(recognizer.experiment.model, padded, lens)
    offline = recognizer.transcribe(wavs)
    assert sum(len(t.tokens) for t in offline) > 0
    for wav, want in zip(wavs, offline):
        samples, rate = soundfile.read(wav, dtype="float32")
        assert rate == recognizer.sample_rate
        for size in (1600, 777):
            stream, partials = recognizer.stream(wav.name), []
            for start in range(0, len(samples), size):
                partials.append(stream.accept(samples[start : start + size]).tokens)
            final = stream.finish()
            assert final.tokens == want.tokens and final.text == want.text
            assert final.source == wav.name
            for before, after in zip(partials, partials[1:] + [final.tokens]):
                assert after[: len(before)] == before
            times = [seconds for _, seconds in stream.emissions]
            assert [t for t, _ in stream.emissions] == final.tokens
            # encoder frame f (stacks of 2 frames, 10 ms apart, 25 ms windows) is complete at
            # (2 f + 1) * 10 + 25 ms, at most the audio's end
            seen = [
                min(len(samples) / rate, (2 * f + 1) * 0.01 + 0.025)
                for _, f in stream.decoder.emissions
            ]
            assert times == pytest.approx(seen) and times == sorted(times)


def test_a_recognizer_stream_refuses_what_it_cannot_stream(tone_data, tmp_path):
    exp_dir = make_experiment(tmp_path / "exp", tone_data, "hat", "hat")  # bidirectional
    write_feature_settings(exp_dir, fbank_options_of(tone_data / "fbank/train", 40), True)
    with pytest.raises(ValueError, match="unidirectional recurrent encoder"):
        Recognizer.from_pretrained(exp_dir).stream()
    uni = make_experiment(
        tmp_path / "uni", tone_data, "hat", "hat", encoder={"bidirectional": False}
    )
    write_feature_settings(uni, fbank_options_of(tone_data / "fbank/train", 40), True)
    with pytest.raises(ValueError, match="searches greedily: no beam"):
        Recognizer.from_pretrained(uni, beam=4).stream()
    # each utterance's own mean needs the whole utterance
    checkpoint = uni / "checkpoints/best.pt"
    saved = torch.load(checkpoint, weights_only=False)
    saved["config"]["data"]["mean_norm"] = "utterance"
    torch.save(saved, checkpoint)
    with pytest.raises(ValueError, match=r"data.mean_norm=utterance.*not streamed"):
        Recognizer.from_pretrained(uni).stream()


def test_cbasr_transcribe_stream_prints_partials_and_ends_on_the_offline_output(
    tone_data, tmp_path, capsys
):
    wavs = sorted((tone_data / "corpus/wav/test").glob("*.wav"))[:3]
    exp_dir = make_streaming_experiment(tmp_path / "exp", tone_data, wavs)
    transcribe.main(["--exp-dir", str(exp_dir), *map(str, wavs)])
    offline = capsys.readouterr().out
    transcribe.main(["--exp-dir", str(exp_dir), "--stream", "--chunk-ms", "100", *map(str, wavs)])
    streamed = capsys.readouterr()
    assert streamed.out == offline and offline.count("\n") == 3
    partials = [line for line in streamed.err.splitlines() if " [partial] " in line]
    assert partials and all(line.split(" [partial] ")[0] in map(str, wavs) for line in partials)
    with pytest.raises(SystemExit, match="--chunk-ms must be >= 1, got 0"):
        transcribe.main(["--exp-dir", str(exp_dir), "--stream", "--chunk-ms", "0", str(wavs[0])])


def test_a_label_is_seen_when_its_block_of_input_is_complete():
    """Encoder frame t of a chunked Conformer (chunks of 3, over stacks of 3 feature frames
    2 apart) is computed with its chunk: once the chunk's last stack is complete."""
    model = builder.build_model(
        {**CHUNKED, "stack": 3, "stride": 2}, tiny.DECODERS["hat"], {"name": "hat"}, 6, 5
    )
    # frames 0 and 2: chunk 0, whose last frame 2 reads feature frames 4..6, complete at
    # 6 * 10 + 25 ms; frame 4: chunk 1, cut short by the utterance's 5 frames (frame 4 reads
    # 8..10); the last at most the utterance's end
    seconds = emission_seconds(model, [0, 2, 4], 5, 0.01, 0.025, 0.2)
    assert seconds == pytest.approx([0.085, 0.085, 0.125])
    assert emission_seconds(model, [4], 5, 0.01, 0.025, 0.11) == [0.11]
    ulstm = builder.build_model(ULSTM, tiny.DECODERS["hat"], {"name": "hat"}, 6, 5)
    assert emission_seconds(ulstm, [0, 3], 9, 0.01, 0.025, 1.0) == pytest.approx([0.035, 0.095])


@pytest.mark.parametrize("left_chunks", [0, 1, 2])
def test_the_export_s_fixed_size_chunk_step_is_the_encoder_s_stream_step(left_chunks):
    """The encoder step ``cbasr-export`` writes for a chunked Conformer (its left context a
    fixed buffer, the frames not yet seen masked out): chunk by chunk, the last one short, the
    eager encoder's stream step with the joint's encoder side; and the unidirectional LSTM's."""
    from cbasr.inference.transducer_export import STEP, TransducerParts

    for encoder in ({**CHUNKED, "left_chunks": left_chunks}, ULSTM):
        model, feats, lens = _model("hat_linear", encoder=encoder)
        model = model.float()
        parts = TransducerParts(model)
        step, x = parts.modules[STEP], model.encoder.subsampling(feats[:1].float(), lens[:1])[0]
        state = list(parts.step_inputs(feats[:1].float(), lens[:1])[1:])
        eager_state = model.encoder.stream_begin()
        count = len(state)
        with torch.no_grad():
            for start in range(0, 10, 3):  # blocks of 3, 3, 3, 1 frames
                block = x[:, start : min(start + 3, 10)]
                out = step(block, *state)
                got, state = out[: len(out) - count], list(out[len(out) - count :])
                h, eager_state = model.encoder.stream_step(block, eager_state)
                side = model.decoder.joint.prepare(h)
                torch.testing.assert_close(got[0], side["enc"], rtol=1e-5, atol=1e-6)
                torch.testing.assert_close(got[1], side["blank_enc"], rtol=1e-5, atol=1e-6)
        if encoder is not ULSTM:
            keep = left_chunks * 3
            assert state[0].tolist() == [min(10, keep)] and state[1].shape == (1, keep, 8)
