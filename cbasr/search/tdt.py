"""Beam search for the token-and-duration transducer (TDT; Xu et al. 2023, "Efficient Sequence
Transduction by Jointly Predicting Tokens and Durations", arXiv:2304.06795).

A TDT edge takes a token and a duration together (eq. 5): from node ``(t, u)`` a blank of
duration ``d >= 1`` moves to frame ``t + d``, a label of duration ``d >= 0`` emits it and moves
to frame ``t + d``; a path ends with a blank landing exactly on frame ``T``
(:mod:`cbasr.losses.tdt`). The prediction network reads the labels only, so all paths that
reach frame ``t`` with the same prefix continue identically and are summed exactly, as the
transducer search recombines them (HAT paper section 3.3). Frames are visited in order, all
the utterances of a batch together; an utterance is evaluated on a frame only if some
hypothesis of its waits there, and a frame none of the batch waits on is skipped (a beam
whose hypotheses all take long durations skips frames as the greedy search does; one that
keeps hypotheses of several durations reaches most frames). The hypotheses reaching frame ``t`` are merged by prefix as
they arrive, the ``SPARE beam`` best kept (``A_t``), and expanded with joint pruning, as the
RNN-T search prunes its label extensions jointly with the blanks
(:mod:`cbasr.search.transducer`):

    C_0 = the beam best of A_t, D = {}
    for s = 0 .. max_symbols:
        the blanks of C_s landing on the utterance's last frame: summed into the finished
            hypotheses F, merged by prefix, the beam best kept
        for every duration d > 0: D += the other blanks of C_s of duration d and its beam
            best labels of duration d, each a hypothesis waiting on frame t + d
        S = the beam best labels of C_s of duration 0 (none if s = max_symbols)
        C_{s+1} = the hypotheses of S among the beam best of D, the blanks of C_0 .. C_s
            that finished, and S
        if C_{s+1} is empty: stop
    A_{t+d} += the hypotheses of D on frame t + d, for every d > 0

The pruning rule: each frame expands its ``beam`` best arrivals (a candidate set per landing
frame as the earlier, unbatched search had: every blank and the ``beam`` best labels of each
duration); a label of duration 0 is expanded further on the frame only if it ranks among the
``beam`` best of everything that moved on from the frame (or ended there) so far and the
other labels staying (ranked by ``am_weight * am + label_bonus * |y|``), so a frame's label
loop stops as soon as the labels that stay fall behind. ``F`` holds the ``beam`` best finished prefixes.

Exactness: without pruning (``beam=None``) nothing is dropped, every sub-step runs while
labels of duration 0 remain, and every finished prefix's ``am_score`` is the log of the
summed mass of its paths with at most ``max_symbols`` labels of duration 0 in a row on one
frame: exactly ``log P(y | x) = -tdt_nll`` when ``max_symbols`` is at least ``|y|`` (tested
against the loss and against path enumeration). With pruning it is the mass of the paths the
beam kept, never more.

The hypotheses are tensors (:mod:`cbasr.search.tdt_entries`): fixed fields per slot, a few
slots per utterance and frame, prefixes known by a 64-bit hash and their length and spelt out
at the end from a prefix tree; the prediction network steps a label extension only when it
is expanded, once per sub-step for the batch. The host reads a few counts per sub-step (the
beams' widths). Fusion with an external or internal language model is not offered here;
``label_bonus`` and ``length_norm`` are.
"""

import torch

from cbasr.modules.decoders import TransducerDecoder
from cbasr.modules.label_context import START
from cbasr.search import tdt_entries as E
from cbasr.search._prefix_tables import extend_hash
from cbasr.search.hypotheses import BeamSearchOptions, Hypothesis
from cbasr.search.prefix import select
from cbasr.search.rows import reorder_rows

__all__ = ["tdt_beam_search"]

_NEG_INF = float("-inf")


@torch.no_grad()
def tdt_beam_search(
    decoder: TransducerDecoder,
    h: torch.Tensor,
    lens: torch.Tensor,
    options: BeamSearchOptions,
    max_symbols: int,
) -> list[list[Hypothesis]]:
    """N-best hypotheses of each utterance (module docstring), best first.

    Args:
        decoder: a transducer decoder with the TDT joint (``decoder.joint.durations``).
        h: ``(B, T, D)`` encoder states; lens: ``(B,)`` frames.
        options: ``beam``, ``nbest``, ``am_weight``, ``label_bonus``, ``length_norm``.
        max_symbols: most labels of duration 0 in a row on one frame.
    """
    if h.shape[0] == 0:
        return []
    search = _Search(decoder, h, lens.to(h.device), options, max_symbols)
    for t in range(h.shape[1]):
        search.frame(t)
    return search.hypotheses()


# a frame keeps the SPARE * beam best of the hypotheses reaching it (a prefix pruned early is
# not summed with its later arrivals), then expands the beam best of them (the earlier search
# kept every arrival until the frame was visited)
SPARE = 2


class _Search:
    """One batch's search: the waiting and finished hypotheses, their prediction-network
    states and the prefix tree."""

    def __init__(self, decoder, h, lens, options: BeamSearchOptions, max_symbols: int):
        self.decoder, self.h, self.lens = decoder, h, lens
        self.options, self.max_symbols = options, max_symbols
        B, device = h.shape[0], h.device
        durations = decoder.joint.durations
        self.durations = torch.tensor(durations, device=device)
        self.moving = self.durations > 0
        self.moving_index = self.moving.nonzero().squeeze(1)
        self.stay = durations.index(0) if 0 in durations else None
        prediction = decoder.prediction
        g, context = prediction.step(
            torch.full((B,), START, dtype=torch.long, device=device),
            prediction.initial_state(B, device),
        )
        self.states = E.States({"g": g, "context": context}, max(durations))
        start = E.empty(B, 1, device)
        start["am"] = torch.where(lens > 0, 0.0, _NEG_INF).double().unsqueeze(1)
        start["row"] = E.States.ids(-1, torch.arange(B, device=device)).unsqueeze(1)
        capacity = None if options.beam is None else SPARE * options.beam
        self.waiting = E.Waiting(start, max(durations) + 1, capacity, options)
        self.finished = E.Finished(B, options, device)
        self.nodes = E.Nodes(device)

    def frame(self, t: int) -> None:
        """Expand the hypotheses waiting on frame ``t`` (module docstring)."""
        popped = self.waiting.pop(t)
        if popped is None:
            return
        utts, c = popped
        options, joint = self.options, self.decoder.joint
        c = E.best(c, options.beam, options)  # C_0
        c, state = self._step(
            c, self.states.read(c["row"].flatten(), (c["am"] > _NEG_INF).flatten())
        )
        enc = joint.encoder_proj(self.h[utts, t])  # (U, J): this frame only
        last = self.lens.index_select(0, utts)
        U = len(utts)
        moved = E.empty(U * int(self.moving.sum()), 0, utts.device)  # D: u J + j on t + d_j
        ended = E.empty(U, 0, utts.device)  # what finished from this frame
        snapshots, offset = [], 0  # the states of C_0, C_1 ...: D's rows
        for s in range(self.max_symbols + 1):
            K = c.shape[1]
            units = joint.out(enc.repeat_interleave(K, dim=0) + joint.label_proj(state["g"]))
            tokens, durs = (x.double() for x in joint.frame_tokens_durations(units))
            snapshots.append(state)
            done, moves, stays = self._edges(t, s, c, tokens, durs, last)
            moves["row"] = E.States.ids(t, moves["row"] + offset)  # (moves and done: copies)
            moved = E.cat(moved, moves)
            if done is not None:
                self.finished.add(utts, done)
                done["frame"] = -1
                ended = E.cat(ended, done)
            offset += U * K
            if stays is None:
                break
            # joint pruning: a label of duration 0 stays if among the beam best of all that
            # moved on from the frame (or finished there) and the labels staying
            pool = E.cat(E.cat(moved.view(U, -1), ended), stays)
            chosen = E.best(pool, options.beam, options)
            chosen["am"].masked_fill_(chosen["frame"] != t, _NEG_INF)
            if not bool((chosen["am"] > _NEG_INF).any()):
                break
            c = E.best(chosen, None, options)  # C_{s+1}, their parents' states: rows of state
            parents = torch.where(c["am"] > _NEG_INF, c["row"], 0).flatten()
            c, state = self._step(c, reorder_rows(state, parents))
        self.states.add(t, snapshots)
        self.waiting.push(utts, t + self.durations[self.moving], moved)

    def _edges(self, t: int, s: int, c: E.Entries, tokens, durs, last):
        """The edges of ``C_s`` (``c (U, K)``) from the joint's ``tokens (U K, V)`` and
        ``durs (U K, |D|)``: ``(done, moves, stays)``. ``done (U, K)``: the blanks landing
        on each utterance's last frame ``last (U,)``, as finished hypotheses (None if no
        duration reaches one); ``moves (U J,
        K + beam)``: for each duration ``d_j > 0``, every other blank of ``d_j`` and the
        ``beam`` best labels of ``d_j``, each a hypothesis on ``t + d_j`` (the module
        docstring's ``X``); ``stays (U, beam)``: the ``beam`` best labels of duration 0, or
        None if none may be taken. A label's state is its parent's (``row``: ``u K + k``), to
        be stepped when it is expanded."""
        options, d = self.options, self.durations
        U, K = c.shape
        nd, V = d.shape[0], tokens.shape[1]
        tokens, durs = tokens.view(U, K, V), durs.view(U, K, nd)
        end = last.view(U, 1, 1)
        land = t + d  # (|D|,)
        blank = (c["am"].unsqueeze(2) + tokens[..., :1] + durs).masked_fill(
            (d == 0) | (land > end), _NEG_INF
        )  # (U, K, |D|)
        finishing, done = land == end, None
        if bool(finishing.any()):
            done = c.replace(am=blank.masked_fill(~finishing, _NEG_INF).amax(dim=2))
            blank = blank.masked_fill(finishing, _NEG_INF)
        blank = blank.transpose(1, 2)  # (U, |D|, K)
        # a row's best labels are the same for every duration: its beam best tokens
        if options.beam is None or options.beam >= V - 1:
            best, which = tokens[..., 1:], torch.arange(1, V, device=d.device).expand(U, K, -1)
        else:
            best, which = tokens[..., 1:].topk(options.beam, dim=2)
            which = which + 1
        L = best.shape[2]
        # a label never lands on the last frame (no blank could end the path there)
        dead = (land >= end.view(U, 1)) | ((d == 0) & (s == self.max_symbols))  # (U, |D|)
        labels = c["am"][:, None, :, None] + best.unsqueeze(1) + durs.transpose(1, 2)[..., None]
        labels = labels.masked_fill(dead[..., None, None], _NEG_INF).view(U * nd, K * L)
        score = labels if options.am_weight == 1 else options.am_weight * labels
        if options.label_bonus:
            length = (c["length"] + 1).unsqueeze(2).expand(U, K, L).reshape(U, 1, K * L)
            score = score + options.label_bonus * length.expand(U, nd, -1).reshape(U * nd, -1)
        _, index, _ = select(score, options.beam)  # (U |D|, W): each duration's best labels
        W, device = index.shape[1], d.device
        slots = torch.arange(K, device=device).expand(U * nd, K)
        rows = torch.cat([slots, index // L], dim=1)  # each candidate's parent slot ...
        rows += (torch.arange(U * nd, device=device) // nd * K).unsqueeze(1)  # ... row: u K + k
        v = which.reshape(U, 1, K * L).expand(U, nd, -1).reshape(U * nd, -1).gather(1, index)
        # the candidates start as copies of their parents (so node is the parent's), then
        # every field that an edge changes is written: K blanks, then W labels per duration
        x = c.x.reshape(U * K, -1)[rows]  # (U |D|, K + W, fields)
        e = E.Entries(x)
        e["am"][:, :K] = blank.reshape(U * nd, K)
        e["am"][:, K:] = labels.gather(1, index)
        e["hash"][:, K:] = extend_hash(e["hash"][:, K:], v)
        e["length"][:, K:] += 1
        e["frame"] = land.repeat(U).unsqueeze(1)
        e["row"] = rows
        e["label"][:, :K] = 0  # the blank
        e["label"][:, K:] = v
        x = x.view(U, nd, K + W, -1)
        moves = E.Entries(x.index_select(1, self.moving_index).flatten(0, 1))
        if self.stay is None or s == self.max_symbols:
            return done, moves, None
        return done, moves, E.Entries(x[:, self.stay, K:])

    def _step(self, c: E.Entries, state):
        """Step the prediction network on the label extensions of ``c`` whose states are
        still their parents' (``state``, row by row of ``c``): ``(c, state)`` with their
        states and nodes of their own."""
        flat = c.view(-1)
        pending = ((flat["label"] > 0) & (flat["am"] > _NEG_INF)).nonzero().squeeze(1)
        if not pending.numel():
            return c, state
        labels = flat["label"].index_select(0, pending)
        parents = reorder_rows(state, pending)
        g, context = self.decoder.prediction.step(labels, parents["context"])
        state = E.put_rows(state, pending, {"g": g, "context": context})
        ids = self.nodes.add(flat["node"].index_select(0, pending), labels)
        c = c.replace(label=0)
        c.view(-1)["node"].index_copy_(0, pending, ids)
        return c, state

    def hypotheses(self) -> list[list[Hypothesis]]:
        """The finished hypotheses of each utterance, best first (``nbest`` of them)."""
        options = self.options
        am, length, node = (self.finished.e[k].tolist() for k in ("am", "length", "node"))
        live = [[i for i, a in enumerate(row) if a > _NEG_INF] for row in am]
        prefixes = iter(self.nodes.spell([node[b][i] for b, row in enumerate(live) for i in row]))
        out = []
        for b, row in enumerate(live):
            hyps = []
            for i in row:
                prefix = next(prefixes)
                score = options.am_weight * am[b][i] + options.label_bonus * length[b][i]
                if options.length_norm:
                    score /= max(length[b][i], 1)
                hyps.append(Hypothesis(list(prefix), score, am[b][i]))
            hyps.sort(key=lambda hyp: -hyp.score)
            out.append(hyps if options.nbest is None else hyps[: options.nbest])
        return out
