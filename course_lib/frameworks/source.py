"""The real code that counts the tokens, each line beside the formula it implements.

``installed()`` finds, with ``inspect``, the lines of the *installed*
``transformers`` that fetch the window, count its supervised labels, gather
the count over the ranks, divide the summed loss by it and multiply by W
(``Trainer.get_batch_samples`` and the loss's ``num_items_in_batch`` path);
``trl_grpo()`` the lines of the installed TRL's ``GRPOTrainer`` that
aggregate each ``loss_type``'s per-token terms (chapter 09).
Each line is found by a fragment of its text, in whatever version is
installed; a fragment the version lacks is printed as missing, never
guessed. ``QUOTED`` holds lines of code that is not installed here
(accelerate's guide, torchtitan #2206), quoted with their commit and line.
``describe`` prints either kind (chapter 08).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from course_lib.core.edition import tr
from course_lib.frameworks import installed as installed_version

FORMULA = 16  # width of the formula column (wider where the edition's labels are)
NOT_FOUND = "not found in this version"  # where a line this version lacks would be


@dataclass(frozen=True)
class Line:
    """A statement of real code, where it is, and what it computes."""

    formula: str  # in the course's notation: S, n, N_r, N, W, M
    where: str  # file:line, and the function
    code: tuple[str, ...]  # the statement's lines, dedented


@dataclass(frozen=True)
class Source:
    """Lines of one piece of code, and where they come from."""

    title: str
    lines: tuple[Line, ...]


@dataclass(frozen=True)
class Wanted:
    """A statement to find in the installed code: the functions to search
    (``owner.name``, an owner of ``_owners``), in order, and the fragments
    that find it."""

    formula: str
    functions: tuple[str, ...]
    fragments: tuple[str, ...]
    count: int = 1  # the lines to show from the one found (a statement's
    # unclosed brackets extend it anyway)
    optional: bool = False  # a version without it shows nothing, not "missing"
    after: tuple[str, ...] = ()  # search only below the first line holding one
    # of these (a branch of the function: the same line recurs in each)


TRAINER = "Trainer"
COUNT = (f"{TRAINER}._get_num_items_in_batch", f"{TRAINER}.get_batch_samples")

# transformers, from the window's fetch to the backward.
TRANSFORMERS = (
    Wanted("the window: M", (f"{TRAINER}.get_batch_samples",),
           ("next(epoch_iterator)",)),
    Wanted("L - 1 or L?", (f"{TRAINER}.__init__",),
           ("self._loss_shifts_labels = ",), optional=True),
    Wanted("loss kwargs?", (f"{TRAINER}.__init__",),
           ("self.model_accepts_loss_kwargs = any(",
            "self.model_accepts_loss_kwargs = "), optional=True),
    # the whole expression where a version has it (a collator's shift_labels
    # first, then labels[..., 1:] or every label), else its labels[..., 1:] branch
    Wanted("n of a row", COUNT, ("labels_for_count = [", 'else batch["labels"][..., 1:]'),
           count=3, optional=True),
    Wanted("N_r = Σ n", COUNT, (".ne(-100).sum()", ".ne(-100)")),
    Wanted("N = Σ_r N_r", COUNT, ("accelerator.gather(",)),
    Wanted("S (a sum)", ("loss_utils.fixed_cross_entropy",),
           ('reduction = "sum"',)),
    Wanted("S / N", ("loss_utils.fixed_cross_entropy",),
           ("loss = loss / num_items_in_batch",)),
    Wanted("W, the processes", (f"{TRAINER}.compute_loss",),
           ("loss_scale = self.accelerator.num_processes",), optional=True),
    Wanted("× W: W·S / N", (f"{TRAINER}.compute_loss",),
           ("loss *= loss_scale", "loss *= self.accelerator.num_processes")),
    Wanted("÷ M skipped?", (f"{TRAINER}.training_step",),
           ("if self.loss_is_scaled_for_ga is not None:", "loss_is_scaled_for_ga = ("),
           count=7, optional=True),
    Wanted("÷ M (mean loss)", (f"{TRAINER}.training_step",),
           ("loss / self.current_gradient_accumulation_steps",
            "loss / self.args.gradient_accumulation_steps")),
)

ACCELERATE_GUIDE = "docs/source/usage_guides/gradient_accumulation.md"
TORCHTITAN = "torchtitan/models/llama3/infra/parallelize.py"

# Lines of code that is not installed here, quoted from a fixed commit.
QUOTED = (
    Source("accelerate's guide, \"Gradient accumulation on training samples of "
           "variable size\" (PR #3193), at commit 16cb6eb (2026-07-24)", (
        Line("N_r' = Σ n'", f"{ACCELERATE_GUIDE}:280", (
            'num_items_in_batch = sum([(batch["labels"].ne(-100)).sum() '
            "for batch in batch_samples])",)),
        Line("N' = Σ_r N_r'", f"{ACCELERATE_GUIDE}:282", (
            "num_items_in_batch = accelerator.gather(num_items_in_batch).sum().item()",)),
        Line("M·W·S / N'", f"{ACCELERATE_GUIDE}:301", (
            "loss = (loss * gradient_accumulation_steps * accelerator.num_processes) "
            "/ num_items_in_batch",)),
    )),
    Source("torchtitan #2206, \"Fix loss computation by handling valid token "
           "imbalance in train loop\", commit 0cb7435 (2026-01-25)", (
        Line("S (a sum)", "torchtitan/components/loss.py:25", ('reduction="sum",',)),
        Line("N_r", "torchtitan/train.py:565", (
            "local_valid_tokens += (labels != IGNORE_INDEX).sum()",)),
        Line("N = Σ_r N_r", "torchtitan/train.py:573", (
            'global_valid_tokens = dist_utils.dist_sum(local_valid_tokens, batch_mesh)',)),
        Line("S / N (no × W)", "torchtitan/train.py:538", (
            "loss = loss_sum / global_valid_tokens",)),
        Line("FSDP: Σ over r", f"{TORCHTITAN}:284", (
            "module.set_gradient_divide_factor(1.0)",)),
        Line("DDP: mean over r", f"{TORCHTITAN}:374", (
            "replicate(model, device_mesh=dp_mesh, bucket_cap_mb=100)",)),
    )),
)


# Where the wanted functions live: owner -> (module, class, or None for the
# module's own functions). Imported only when a wanted line names the owner.
OWNERS: dict[str, tuple[str, str | None]] = {
    "Trainer": ("transformers.trainer", "Trainer"),
    "loss_utils": ("transformers.loss.loss_utils", None),
    "Accelerator": ("accelerate.accelerator", "Accelerator"),
    "_ResultMetric": ("lightning.pytorch.trainer.connectors.logger_connector.result",
                      "_ResultMetric"),
    "fabric_distributed": ("lightning.fabric.utilities.distributed", None),
    "GRPOTrainer": ("trl.trainer.grpo_trainer", "GRPOTrainer"),
}


def _resolve(target: str) -> tuple[Any, str, Path] | None:
    """The function, its shown name, and the folder its package sits in;
    None when the package is not installed or lacks the function."""
    owner, _, name = target.partition(".")
    module, cls = OWNERS[owner]
    try:
        found: Any = importlib.import_module(module)
    except ImportError:
        return None
    top = importlib.import_module(module.partition(".")[0])
    if cls is not None:
        found = getattr(found, cls, None)
    fn = getattr(found, name, None)
    if fn is None:
        return None
    return fn, name if cls is None else target, Path(top.__file__ or "").parent.parent


def _statement(lines: list[str], start: int, count: int) -> list[str]:
    """``count`` lines from ``start``, extended while a bracket is open."""
    end, depth = start, 0
    while end < len(lines):
        depth += sum(lines[end].count(c) for c in "([{")
        depth -= sum(lines[end].count(c) for c in ")]}")
        end += 1
        if end - start >= count and depth <= 0:
            break
    block = lines[start:end]
    indent = min(len(s) - len(s.lstrip()) for s in block if s.strip())
    return [s[indent:].rstrip() for s in block]


def find(wanted: Wanted) -> Line | None:
    """The first statement that a fragment finds, in the first function that
    has one; None when no installed function has any."""
    for target in wanted.functions:
        resolved = _resolve(target)
        if resolved is None:
            continue
        obj, name, root = resolved
        lines, first = inspect.getsourcelines(obj)
        shown = Path(inspect.getsourcefile(obj) or "").relative_to(root)
        start = 0
        if wanted.after:
            anchors = [i for i, text in enumerate(lines)
                       if any(a in text for a in wanted.after)]
            if not anchors:
                continue
            start = anchors[0] + 1
        for fragment in wanted.fragments:
            for i, text in enumerate(lines[start:], start):
                if fragment in text:
                    return Line(wanted.formula, f"{shown.as_posix()}:{first + i} in {name}",
                                tuple(_statement(lines, i, wanted.count)))
    return None


def _found(wanted: Sequence[Wanted]) -> tuple[Line, ...]:
    """Each wanted line as installed; one this version lacks (and needs) is
    printed as not found, with the fragments it was looked for by."""
    found = []
    for w in wanted:
        line = find(w)
        if line is None and not w.optional:
            line = Line(w.formula, NOT_FOUND,
                        (" or ".join(repr(f) for f in w.fragments),))
        if line is not None:
            found.append(line)
    return tuple(found)


def installed() -> Source:
    """The lines of the installed transformers, from the fetch to the backward."""
    version = installed_version("transformers")
    return Source(tr("transformers {version}, installed here").format(version=version),
                  _found(TRANSFORMERS))


def _where(line: Line) -> str:
    """A line's file:line in function, "in" in the learner's language."""
    return (tr("not found in this version") if line.where == NOT_FOUND  # the catalog's key
            else line.where.replace(" in ", tr(" in "), 1))


def describe(*sources: Source) -> str:
    """Each line beside the formula it implements: formula, file:line, code.
    The titles and labels in the learner's language (``COURSE_EDITION``; the
    catalog has each of ``labels()``); ``Line.formula`` itself stays as
    written, since chapters pick lines by it."""
    shown = {line.formula: tr(line.formula) for source in sources for line in source.lines}
    width = max([FORMULA, *map(len, shown.values())])
    out = []
    for source in sources:
        out.append(tr(source.title))  # a quoted source's; the others are made in the edition
        for line in source.lines:
            out.append(f"  {shown[line.formula]:<{width}}  {_where(line)}")
            out.extend(f"  {'':<{width}}    {code}" for code in line.code)
    return "\n".join(out)


def labels() -> set[str]:
    """Every label ``describe`` writes beside a line, the quoted sources'
    and the logging sources' titles, and the word before a line's function:
    what the catalog translates."""
    wanted = [*TRANSFORMERS, *(w for _, _, ws in LOGGING for w in ws),
              *(w for _, ws in TRL_GRPO for w in ws)]
    return ({w.formula for w in wanted} | {line.formula for s in QUOTED for line in s.lines}
            | {s.title for s in QUOTED} | {title for title, _, _ in LOGGING} | {" in "})


# 07: how each framework turns the ranks' losses into the number it logs,
# in the installed packages. The labels say where a line runs, not what it
# computes: chapter 07 asks the learner to write each in S_r and N_r.
LOGGING = (
    ("HF train loss", "transformers", (
        Wanted("each rank", (f"{TRAINER}.compute_loss",),
               ("loss_scale = self.accelerator.num_processes",), count=2),
        Wanted("the log", (f"{TRAINER}._maybe_log_save_evaluate",),
               ("tr_loss_scalar = ",)),
    )),
    ("HF eval_loss", "transformers", (
        Wanted("each rank, step", (f"{TRAINER}.prediction_step",),
               ("num_items_in_batch = self._get_num_items_in_batch([inputs]",)),
        Wanted("each rank, step", (f"{TRAINER}.prediction_step",),
               ("loss, outputs = self.compute_loss(",), count=3),
        Wanted("every step", (f"{TRAINER}.evaluation_loop",),
               ("losses = self.gather_function(losses.repeat(batch_size))",)),
        Wanted("the log", (f"{TRAINER}.evaluation_loop",),
               ('metrics[f"{metric_key_prefix}_loss"] = losses.mean()',)),
    )),
    ("accelerate gather_for_metrics(loss)", "accelerate", (
        Wanted("every step", ("Accelerator.gather_for_metrics",),
               ("data = self.gather(input_data)",)),
        Wanted("the last step", ("Accelerator.gather_for_metrics",),
               ("return tensor[: self.gradient_state.remainder]",)),
    )),
    ("Lightning self.log(..., sync_dist=True)", "lightning", (
        Wanted("on_step", ("_ResultMetric.update",),
               ("self._forward_cache = self.meta.sync(value.clone())",)),
        Wanted("on_epoch", ("_ResultMetric.update",),
               ("self.value = self.value + value * batch_size",), count=2),
        Wanted("on_epoch, end", ("_ResultMetric.compute",),
               ("value = self.meta.sync(self.value.clone())",), count=4),
        Wanted("sync: the sum", ("fabric_distributed._sync_ddp",),
               ("torch.distributed.all_reduce(result, op=op",)),
        Wanted("sync: ÷ W", ("fabric_distributed._sync_ddp",),
               ("if not torch.is_floating_point(result):",), count=3),
    )),
)


def logging() -> tuple[Source, ...]:
    """07: the installed lines that make each framework's logged loss."""
    sources = []
    for title, package, wanted in LOGGING:
        found = []
        for w in wanted:
            line = find(w)
            found.append(line or Line(w.formula, NOT_FOUND,
                                      (" or ".join(repr(f) for f in w.fragments),)))
        sources.append(Source(f"{tr(title)}{tr(': ')}{package} {installed_version(package)}",
                              tuple(found)))
    return tuple(sources)


def logged_lines(source: Source, keep: Sequence[int]) -> str:
    """07: the lines ``keep`` (indices) of one of ``logging()``'s sources,
    each under its file:line. The Trainer's branch for n_gpu > 1
    (DataParallel, unused with torchrun) is cut from its lines."""
    out = [source.title]
    for line in (source.lines[i] for i in keep):
        out.append("  " + _where(line))
        out.extend("      " + code.split(" if self.args.n_gpu")[0] for code in line.code)
    return "\n".join(out)


def trainer_loss_condition() -> str:
    """07: the installed ``if`` above ``Trainer.compute_loss``'s two
    ``loss_scale`` lines (when the loss is scaled by W), its comments cut."""
    import textwrap

    found = _resolve(f"{TRAINER}.compute_loss")
    if found is None:
        return tr(NOT_FOUND)
    body = inspect.getsource(found[0]).splitlines()
    try:  # a release that scales the loss elsewhere has no such lines
        end = next(i for i, s in enumerate(body) if "loss_scale =" in s)
        start = max(i for i in range(end) if body[i].lstrip().startswith("if"))
    except (StopIteration, ValueError):
        return tr(NOT_FOUND)
    guard = textwrap.dedent("\n".join(body[start:end])).splitlines()
    return "\n".join(s for s in guard if not s.lstrip().startswith("#"))


# 09: TRL's GRPOTrainer, the lines that turn the per-token terms into the
# loss a microbatch backprops, one branch of _compute_loss per loss_type.
# B completions a microbatch, n_s a completion's tokens, M = GA, W the ranks.
GRPO_LOSS = "GRPOTrainer._compute_loss"
GRPO_BRANCH = {name: (f'self.loss_type == "{name}"', f'self.loss_type in ["{name}"')
               for name in ("grpo", "dr_grpo")}
GRPO_BRANCH["dapo"] = ('self.loss_type in ["cispo", "dapo"', 'self.loss_type == "dapo"')
TRL_GRPO = (
    ("the token term", (
        Wanted("ratio π/π_old", (GRPO_LOSS,), ("coef_1 = torch.exp(log_importance_weights)",)),
        Wanted("-A·ratio", (GRPO_LOSS,), ("per_token_loss1 = coef_1 * advantages",),
               count=3),
    )),
    ("grpo", (
        Wanted("(1/B)Σ_s S_s/n_s", (GRPO_LOSS,),
               ("loss = ((per_token_loss * mask).sum(-1) / mask.sum(-1)",
                "loss = ((per_token_loss * completion_mask).sum(-1) / "
                "completion_mask.sum(-1)"), after=GRPO_BRANCH["grpo"]),
        Wanted("M (= GA)", (GRPO_LOSS,), ("normalizer = self.current_gradient_accumulation",),
               after=GRPO_BRANCH["grpo"], optional=True),
        Wanted("÷ M", (GRPO_LOSS,), ("loss = loss / normalizer",
                                     "loss = loss / self.current_gradient_accumulation"),
               after=GRPO_BRANCH["grpo"]),
    )),
    ("dr_grpo", (
        Wanted("Σ A l/(B·L_max)", (GRPO_LOSS,), ("* self.max_completion_length)",),
               after=GRPO_BRANCH["dr_grpo"]),
        Wanted("M (= GA)", (GRPO_LOSS,), ("normalizer = self.current_gradient_accumulation",),
               after=GRPO_BRANCH["dr_grpo"], optional=True),
        Wanted("÷ M", (GRPO_LOSS,), ("loss = loss / normalizer",
                                     "loss = loss / self.current_gradient_accumulation"),
               after=GRPO_BRANCH["dr_grpo"]),
    )),
    ("dapo", (
        Wanted("N_gen, all ranks", ("GRPOTrainer._generate_and_score_completions",),
               ("num_items_in_batch = self.accelerator.gather(",)),
        Wanted("N_gen / W", (GRPO_LOSS,), ('normalizer = inputs["num_items_in_batch"]',),
               after=GRPO_BRANCH["dapo"]),
        Wanted("× M / spg", (GRPO_LOSS,), ("normalizer = normalizer * self.current_gradient",),
               after=GRPO_BRANCH["dapo"], optional=True),
        Wanted("Σ A l / that", (GRPO_LOSS,),
               ("loss = (per_token_loss * mask).sum() / normalizer", "/ normalizer"),
               after=GRPO_BRANCH["dapo"]),
    )),
)


def trl_grpo() -> dict[str, Source]:
    """09: the installed TRL's GRPO lines, by loss_type ("the token term"
    first): a line this version lacks is printed as not found."""
    version = installed_version("trl")
    found = {}
    for title, wanted in TRL_GRPO:
        shown = tr("the token term") if title == "the token term" else f"loss_type={title!r}"
        found[title] = Source(tr("TRL {version}, GRPOTrainer: {shown}").format(
            version=version, shown=shown), _found(wanted))
    return found
