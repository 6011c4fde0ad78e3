"""Transducer models: RNN-T (torchaudio's loss) and HAT (HAT paper eq. 4), on the whole
lattice or, in training, on the windows of a pruned loss (:mod:`cbasr.losses.pruned`), in the
standard topology or the one-label-per-frame one (:mod:`cbasr.losses.transducer`); and TDT,
the token-and-duration transducer on its own lattice (:mod:`cbasr.losses.tdt`)."""

import torch
from torch import nn

from cbasr.losses import (
    ctc_nll,
    hat_internal_lm_score,
    hat_nll_from_logits,
    pruned_transducer_nll,
    rnnt_lattice_nll,
    rnnt_nll,
    simple_transducer_nll,
)
from cbasr.losses.pruned import label_columns
from cbasr.losses.tdt import tdt_nll
from cbasr.models.base import AsrModel, LossOutput
from cbasr.models.transducer_greedy import (
    Emissions,
    LabelLoopingGraphs,
    frame_looping_greedy,
    label_looping_greedy,
    tdt_greedy,
)
from cbasr.modules.decoders import TransducerDecoder

__all__ = ["TransducerModel"]


class TransducerModel(AsrModel):
    """Encoder + prediction network + joint, trained on the whole transducer lattice.

    Args:
        encoder, decoder: the modules; ``decoder`` a :class:`TransducerDecoder` whose joint
            matches ``criterion``.
        criterion: ``"rnnt"``, ``"hat"`` or ``"tdt"`` (the decoder's joint names it).
        max_symbols: most labels greedy search emits on one frame (TDT: most labels of
            duration 0 in a row on one frame; then it moves on a frame).
        prune_range: 0 trains on the whole lattice; ``S >= 2`` trains with the pruned loss
            (Kuang et al. 2022, arXiv:2206.13236; :mod:`cbasr.losses.pruned`): the joint on
            ``S`` label positions per frame, chosen by a trivial joint ``W_a f_t + W_l g_u``
            whose own loss is added with weight ``simple_loss_scale``. Evaluation
            (``model.eval()``) computes the exact loss on the whole lattice.
        simple_loss_scale: the trivial joint's loss weight when pruning.
        topology: ``"standard"`` (the RNN-T lattice) or ``"monotonic"``: one label per
            frame, a label edge advancing the frame too (Tripathi et al. 2019, ASRU;
            :mod:`cbasr.losses.transducer`); its searches emit at most one label per frame
            (``max_symbols`` is 1) and take no blank after an emission.
        greedy: the greedy search's rule on each frame: ``"label"`` emits the best label
            where it beats the blank, ``"emission"`` where ``P(not blank) > P(blank)`` (the
            labels' summed probability beats the blank's; for HAT ``1 - b > b``), so a frame
            whose label mass is spread over several labels still emits.
        ctc_weight: an auxiliary CTC loss on the encoder, through a linear layer of its own
            (as ESPnet, icefall and NeMo's hybrid RNNT-CTC models train), added with this
            weight in training; 0 (the default) has no such layer. Validation reports the
            transducer's loss alone.
        sigma: TDT only: the logit under-normalisation of Xu et al. 2023 (eqs. 15-16),
            subtracted from every token log-probability in training.
        fastemit_lambda: RNN-T and HAT: FastEmit (Yu et al. 2021, arXiv:2010.11148), the
            gradient of every label edge scaled by ``1 + lambda``
            (:func:`cbasr.losses.transducer_lattice_nll`; with the pruned loss, the label edges
            inside the windows, not the trivial joint's); the loss reported is the NLL.
        dual_mode: RNN-T and HAT over a chunked Conformer: dual-mode training (Yu et al.
            2021, "Dual-mode ASR: Unify and Improve Streaming ASR with Full-context Modeling",
            arXiv:2010.06030): each training batch goes through the encoder twice, streaming
            and full-context (:meth:`ConformerEncoder.full_context`, the same weights), and
            the two modes' losses are added; the model decodes in its streaming mode.
        distill_weight: with ``dual_mode``, in-place distillation (the same paper, with the
            three-way distributions of Panchapagesan et al. 2021, "Efficient Knowledge
            Distillation for RNN-Transducer Models", arXiv:2011.06110): at every node
            ``(t, u)`` of the lattice the full-context joint's ``P(blank)``, ``P(y_{u+1})``
            and the rest teach the streaming one's, ``KL(full || streaming)``, the teacher's
            side without gradient. Per utterance, the nodes' mean times its labels, at least
            one (the NLL's scale), added with this weight.
        align_restrict_left: HAT, the standard topology: alignment-restricted training's
            lower bound (Mahadeokar et al. 2021, "Alignment Restricted Streaming Recurrent
            Neural Network Transducer", arXiv:2011.03072, its left buffer ``b_l``; not its
            upper one), ``>= 0`` (the schema refuses a negative one): in training, label ``u``
            has no edge on the frames before ``e_u - align_restrict_left``, ``e_u`` the encoder
            frame holding the end of the label's gold segment (``label_ends`` of :meth:`loss`,
            from the corpus's phone or word times; a label without one is not bounded). None:
            off. Meant for a streaming model that emits a label before its segment is over, on
            a chunk that does not hold its end. The next label's score gets ``-1e4`` there;
            HAT's blank is a sigmoid of its own, so its probability stays (an RNN-T softmax
            would renormalise it: refused). That loss is the whole lattice's, even with
            ``prune_range`` (windows chosen by the trivial joint need not hold a path that
            waits out the barred frames); validation and the full-context mode of
            ``dual_mode`` keep every edge (and their pruning). What 0, 1 and 2 frames do to
            the synth recipe's streaming HAT: recipes/synth/RESULTS.md, "Alignment-restricted
            training".

    Attribute ``greedy_loop``: how the greedy search walks a batch, ``"label"`` (label-looping),
    ``"graphs"`` (label-looping replayed from CUDA graphs: CUDA only), ``"auto"`` (the default:
    ``"graphs"`` for a model in eval mode on a GPU, else ``"label"``) or ``"frame"``
    (:mod:`cbasr.models.transducer_greedy`); the hypotheses are the same, the cost on a GPU is
    not (``scripts/bench_greedy.py``).
    """

    def __init__(
        self,
        encoder,
        decoder,
        criterion: str = "rnnt",
        max_symbols: int = 4,
        prune_range: int = 0,
        simple_loss_scale: float = 0.5,
        topology: str = "standard",
        greedy: str = "label",
        ctc_weight: float = 0.0,
        sigma: float = 0.0,
        fastemit_lambda: float = 0.0,
        dual_mode: bool = False,
        distill_weight: float = 0.0,
        align_restrict_left: int | None = None,
    ):
        super().__init__(encoder, decoder)
        reason = self.supports(decoder, criterion=criterion, prune_range=prune_range)
        if reason:
            raise ValueError(reason)
        # the loss group's own checks are TransducerLossConfig's (cbasr.config.schema); the
        # ones that read the encoder too:
        if dual_mode and not (hasattr(encoder, "full_context") and encoder.chunked):
            raise ValueError(
                "dual_mode needs a chunked Conformer encoder (encoder.chunk_size > 0), got "
                f"{type(encoder).__name__} with chunk_size {getattr(encoder, 'chunk_size', None)}"
            )
        self.fastemit, self.sigma = fastemit_lambda, sigma
        self.dual_mode, self.distill_weight = bool(dual_mode), distill_weight
        self.align_restrict_left = align_restrict_left
        self.monotonic, self.greedy = topology == "monotonic", str(greedy)
        self.greedy_loop = "auto"
        self._graphs = None  # greedy_loop="graphs": the captured searches, made on first use
        self.ctc_weight = ctc_weight
        if ctc_weight:  # the encoder's own frame posteriors over the V units, blank 0
            vocab = decoder.prediction.embedding.num_embeddings
            self.ctc_head = nn.Linear(decoder.joint.encoder_proj.in_features, vocab)
        self.criterion = criterion
        self.max_symbols = 1 if self.monotonic else max_symbols
        self.prune_range, self.simple_loss_scale = prune_range, simple_loss_scale
        if prune_range:
            joint = decoder.joint
            units = joint.out[-1].out_features
            self.simple_am = nn.Linear(joint.encoder_proj.in_features, units)
            self.simple_lm = nn.Linear(joint.label_proj.in_features, units, bias=False)

    @property
    def needs_label_ends(self) -> bool:
        """Whether training wants each label's gold end frame (``align_restrict_left``)."""
        return self.align_restrict_left is not None

    def barred_edges(self, T: int, lens: torch.Tensor, label_ends=None) -> torch.Tensor | None:
        """``(B, T, U + 1)``: True where the label edge of node ``(t, u)`` is removed in
        training: with ``align_restrict_left``, the frames before ``label_ends (B, U)`` (the
        encoder frame of each label's gold end, negative for none) minus that buffer, clamped
        to an utterance's last frame (``lens``) so that a path is left; None where none is
        removed (off, evaluating, or no ends given)."""
        if not (self.training and self.needs_label_ends and label_ends is not None):
            return None
        lens = lens.to(label_ends.device)
        unknown = label_ends < 0
        earliest = label_ends - self.align_restrict_left
        earliest = torch.minimum(earliest, lens[:, None] - 1).masked_fill(unknown, 0)
        earliest = nn.functional.pad(earliest, (0, 1), value=0)  # node U: no label edge
        return torch.arange(T, device=lens.device)[None, :, None] < earliest[:, None, :]

    @staticmethod
    def _bar_labels(units, label_units, barred, offset: int) -> torch.Tensor:
        """``units (B, T, U + 1, K)`` with ``-1e4`` added to the next label's column (unit
        ``label_units (B, T, U + 1)`` at column ``unit - offset``; unit 0: none) on the nodes
        ``barred`` (:meth:`barred_edges`, ``(B, T, U + 1)``)."""
        hit = barred & (label_units > 0)  # (B, T, U + 1)
        column = (label_units - offset).clamp(min=0).unsqueeze(-1)
        bias = torch.where(hit, -1.0e4, 0.0).to(units.dtype).unsqueeze(-1)
        return units + torch.zeros_like(units).scatter(-1, column, bias)

    @classmethod
    def supports(cls, decoder, criterion: str = "rnnt", prune_range: int = 0, **loss_options):
        if not isinstance(decoder, TransducerDecoder):
            return f"the {criterion} loss needs a transducer decoder (prediction network + joint)"
        if decoder.joint.name != criterion:
            return (
                f"the {criterion} loss needs joint={criterion!r}; "
                f"this decoder has joint={decoder.joint.name!r}"
            )
        if prune_range and getattr(decoder.joint, "linear_blank", False):
            return "the pruned loss (prune_range > 0) needs blank_joint=tanh"
        if prune_range and criterion == "tdt":
            return "the pruned loss (prune_range > 0) has no TDT form"
        return None

    @property
    def topology(self) -> str:
        return "monotonic" if self.monotonic else "standard"

    def check_utterance(self, num_frames: int, targets: list[int]) -> str | None:
        """A transducer emits any number of labels per frame: it needs one frame; the pruned
        loss's windows hold at most ``prune_range - 1`` labels per frame; the one-label-per-
        frame topology at most one."""
        frames = self.output_frames(num_frames)
        if frames < 1:
            return f"{num_frames} frames leave no frame after subsampling"
        if self.criterion == "tdt" and 0 not in self.decoder.joint.durations:
            if len(targets) >= frames:
                return (
                    f"{len(targets)} labels in {frames} frames: without duration 0 each label "
                    "and the final blank take a frame of their own"
                )
        if self.monotonic and len(targets) > frames:
            return (
                f"{len(targets)} labels in {frames} frames: the one-label-per-frame topology "
                "emits at most 1 per frame"
            )
        if self.prune_range and len(targets) > frames * (self.prune_range - 1):
            return (
                f"{len(targets)} labels in {frames} frames: more than prune_range - 1 = "
                f"{self.prune_range - 1} per frame"
            )
        repeats = sum(a == b for a, b in zip(targets, targets[1:]))
        if self.ctc_weight and frames < len(targets) + repeats:
            return (
                f"{len(targets)} labels with {repeats} repeats in {frames} frames: the auxiliary "
                "CTC loss (ctc_weight) has no alignment"
            )
        return None

    def loss(self, feats, feat_lens, targets, target_lens, label_ends=None):
        """``label_ends (B, L)``: for ``align_restrict_left``, the encoder frame of each
        label's gold end, negative for none (:meth:`barred_edges`); ignored without it."""
        h, lens = self.encoder(feats, feat_lens)
        barred = self.barred_edges(h.shape[1], lens, label_ends)
        if not (self.dual_mode and self.training):
            return self._loss(h, lens, targets, target_lens, barred)
        with self.encoder.full_context():
            full, _ = self.encoder(feats, feat_lens)
        out = self._loss(h, lens, targets, target_lens, barred)
        # (the first pass's loss checked the targets and lengths; without its barred edges it
        # is the same loss, the pruned one's windows included)
        other = self._loss(full, lens, targets, target_lens, values_checked=barred is None)
        labels = target_lens.to(out.nll.device).sum().clamp(min=1)
        stats = {**out.stats, "full_context_loss": other.nll.sum() / labels}
        loss = out.loss + other.loss
        if self.distill_weight:
            kd = self.distillation(full, h, lens, targets, target_lens)
            stats["distill"] = kd.detach().sum() / labels
            loss = loss + self.distill_weight * kd
        return LossOutput(loss, out.nll, stats)

    def distillation(self, teacher, student, lens, targets, target_lens) -> torch.Tensor:
        """The in-place distillation term of ``dual_mode`` (``distill_weight``, class
        docstring), ``(B,)``: the encoder outputs ``teacher`` and ``student`` ``(B, T, D)``
        through the same prediction network outputs."""
        g = self.decoder.history(targets)
        with torch.no_grad():
            want = self._three_way(teacher, g.detach(), targets)
        got = self._three_way(student, g, targets)
        kl = (want.exp() * (want - got)).sum(-1)  # (B, T, U + 1)
        T, U1 = kl.shape[1], kl.shape[2]
        lens, target_lens = lens.to(kl.device), target_lens.to(kl.device)
        valid = (torch.arange(T, device=kl.device) < lens[:, None])[:, :, None] & (
            torch.arange(U1, device=kl.device) <= target_lens[:, None]
        )[:, None, :]
        nodes = (lens * (target_lens + 1)).clamp(min=1)
        return (kl * valid).sum((1, 2)) / nodes * target_lens.clamp(min=1)

    def _three_way(self, h, g, targets) -> torch.Tensor:
        """``(B, T, U + 1, 3)`` log probabilities at every node: the blank, the next label
        ``y_{u+1}`` (any fixed label past the last, the same for both modes) and the rest."""
        B = targets.shape[0]
        nxt = torch.cat([targets, targets.new_ones(B, 1)], 1).clamp(min=1)  # (B, U + 1)
        lb, ly = self.lattice_log_probs(h, g, nxt)
        used = torch.logaddexp(lb, ly).clamp(max=-1e-7)
        return torch.stack([lb, ly, torch.log(-torch.expm1(used))], -1)

    def lattice_log_probs(self, h, g, labels) -> tuple[torch.Tensor, torch.Tensor]:
        """RNN-T and HAT: at every node ``(t, u)`` of the lattice of encoder outputs ``h (B,
        T, D)`` and prediction outputs ``g (B, U + 1, H)``, ``log P(blank)`` and ``log
        P(labels[:, u])`` (``labels (B, U + 1)``, ids >= 1), each ``(B, T, U + 1)``."""
        index = labels[:, None, :, None].expand(-1, h.shape[1], -1, 1)
        if self.criterion == "hat":  # eq. (4): the labels' softmax under log(1 - b)
            blank, log_probs = self.decoder.joint.lattice(h, g)  # labels: units 1.. as 0..
            picked = log_probs.gather(-1, index - 1).squeeze(-1)
            return nn.functional.logsigmoid(blank), nn.functional.logsigmoid(-blank) + picked
        log_probs = self.decoder.joint.lattice(h, g).log_softmax(dim=-1)
        return log_probs[..., 0], log_probs.gather(-1, index).squeeze(-1)

    @torch.no_grad()
    def validate_batch(self, feats, feat_lens, targets, target_lens):
        h, lens = self.encoder(feats, feat_lens)
        return self._loss(h, lens, targets, target_lens), self._greedy(h, lens)

    def _loss(self, h, lens, targets, target_lens, barred=None, values_checked=False):
        """The loss on encoder outputs ``h``; ``barred``: the nodes without a label edge
        (:meth:`barred_edges`); ``values_checked``: the pruned loss reads no value a loss on
        the same targets and lengths has checked (dual mode's second pass)."""
        if self.prune_range and self.training and barred is None:
            out = self._pruned_loss(h, lens, targets, target_lens, values_checked)
        else:
            out = self._lattice_loss(h, lens, targets, target_lens, barred)
        if not (self.ctc_weight and self.training):
            return out
        log_probs = self.ctc_head(h).log_softmax(dim=-1)  # (B, T, V)
        # the transducer's loss has checked these lengths and label ids (the same V, blank 0)
        ctc = ctc_nll(log_probs, targets, lens, target_lens, values_checked=True)
        labels = target_lens.to(ctc.device).sum().clamp(min=1)
        stats = {**out.stats, "ctc_loss": ctc.detach().sum() / labels}
        return LossOutput(out.loss + self.ctc_weight * ctc, out.nll, stats)

    def _lattice_loss(self, h, lens, targets, target_lens, barred=None) -> LossOutput:
        """The transducer's loss on the whole lattice."""
        if self.criterion == "rnnt":
            logits = self.decoder(h, lens, targets)
            if logits.is_cuda and not (self.monotonic or self.fastemit):
                # torchaudio's CUDA kernel (the standard topology, no FastEmit); on a CPU the
                # fused-gather lattice (recipes/synth/RESULTS.md, "Measurements behind defaults")
                nll = rnnt_nll(logits, targets, lens, target_lens)
            else:
                nll = rnnt_lattice_nll(
                    logits, targets, lens, target_lens, 0, self.monotonic, self.fastemit
                )
            return LossOutput(nll, nll.detach(), {})
        if self.criterion == "tdt":
            tokens, durations = self.decoder(h, lens, targets)
            sigma = self.sigma if self.training else 0.0
            joint = self.decoder.joint
            nll = tdt_nll(tokens, durations, targets, lens, target_lens, joint.durations, sigma)
            return LossOutput(nll, nll.detach(), {})
        blank_logits, units = self.decoder.hat_scores(h, targets)
        if barred is not None:  # label y at column y, or y - 1 beside a linear blank's logits
            label_units = label_columns(targets, target_lens)[:, None, :].expand_as(units[..., 0])
            offset = 0 if blank_logits is None else 1
            units = self._bar_labels(units, label_units, barred, offset)
        nll = hat_nll_from_logits(
            blank_logits,
            units,
            (targets - 1).clamp(min=0),
            lens,
            target_lens,
            self.monotonic,
            self.fastemit,
        )
        return LossOutput(nll, nll.detach(), {})

    def _pruned_loss(self, h, lens, targets, target_lens, values_checked: bool) -> LossOutput:
        """The pruned loss plus ``simple_loss_scale`` times the trivial joint's; reports the
        pruned loss (an upper bound of the exact NLL) and the trivial joint's per label."""
        hat = self.criterion == "hat"
        g = self.decoder.history(targets)  # (B, U + 1, H); label y is unit y of the joint
        am, lm, S = self.simple_am(h), self.simple_lm(g), self.prune_range
        simple, starts = simple_transducer_nll(
            am,
            lm,
            targets,
            lens,
            target_lens,
            S,
            hat,
            self.monotonic,
            values_checked=values_checked,
        )
        units = self.decoder.joint.pruned_scores(h, g, starts, S)
        nll = pruned_transducer_nll(  # the lengths and labels: checked by the simple loss
            units, starts, targets, lens, target_lens, hat, self.monotonic, self.fastemit,
            values_checked=True,
        )  # fmt: skip
        labels = target_lens.to(simple.device).sum().clamp(min=1)
        stats = {"simple_loss": simple.detach().sum() / labels}
        return LossOutput(nll + self.simple_loss_scale * simple, nll.detach(), stats)

    @torch.no_grad()
    def internal_lm_score(self, targets: torch.Tensor, target_lens: torch.Tensor) -> torch.Tensor:
        """``log P_ILM(y)`` of HAT paper eq. (8), ``(B,)``."""
        ilm = self.decoder.internal_lm_log_probs(targets)
        return hat_internal_lm_score(ilm, (targets - 1).clamp(min=0), target_lens)

    @torch.no_grad()
    def greedy_decode(self, feats, feat_lens):
        """Per frame, emit the best label while it beats the blank (``greedy="label"``) or while
        the labels' summed probability does (``"emission"``), at most ``max_symbols`` times
        (TDT: its own greedy search); :mod:`cbasr.models.transducer_greedy`."""
        return self._greedy(*self.encoder(feats, feat_lens))

    @torch.no_grad()
    def greedy_emissions(self, feats, feat_lens) -> Emissions:
        """:meth:`greedy_decode`'s labels with the encoder frame on which each was emitted."""
        return self._greedy(*self.encoder(feats, feat_lens), frames=True)

    def _greedy(self, h: torch.Tensor, lens: torch.Tensor, frames: bool = False):
        if self.criterion == "tdt":
            return tdt_greedy(self.decoder, h, lens, self.max_symbols, frames)
        loop = self.greedy_loop
        if loop == "auto":  # replayed graphs where they can be: decoding on a GPU
            loop = "graphs" if h.is_cuda and not self.training else "label"
        if loop == "graphs":
            if self._graphs is None:
                self._graphs = LabelLoopingGraphs(self.decoder, self.max_symbols, self.greedy)
            return self._graphs(h, lens, frames)
        if loop not in ("label", "frame"):
            raise ValueError(f"greedy_loop must be auto, label, graphs or frame, got {loop!r}")
        search = label_looping_greedy if loop == "label" else frame_looping_greedy
        return search(self.decoder, h, lens, self.max_symbols, self.greedy, frames=frames)
