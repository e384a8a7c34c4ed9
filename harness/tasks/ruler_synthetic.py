"""RULER's synthetic tasks as pure text: the generators of NVIDIA/RULER (commit c3f5e3b,
``scripts/data/synthetic/``: niah.py, variable_tracking.py, common_words_extraction.py,
freq_words_extraction.py; templates from its ``constants.py``, task settings from
``scripts/synthetic.yaml``) reimplemented over our own corpus and private generators. No model here:
:mod:`harness.tasks.ruler` renders and measures the prompts with the model's tokenizer.

A sample is a :class:`Draft`: every random choice is drawn first, then ``user(n)`` builds the user
turn around a haystack of ``n`` units (essay words, noise sentences, distractor needles, uncommon
words, coded words), so the prompt grows with ``n`` alone; :func:`fit` finds the largest ``n``
that fits the token budget, as RULER's binary search over the haystack size does. ``gen(*tag)``
gives the sample's private generators (:func:`kernels.private_generator` of the prompt and seed,
plus ``tag``): ``gen()`` for the draws that do not depend on ``n``, ``gen("n", n)`` for the order of
a list of ``n``-dependent length, ``gen("haystack", j)`` for the j-th chunk of distractors (chunks,
so that the first ``n`` distractors are the same whatever ``n`` the search tries).

Where we differ from RULER, and why:
- keys are needle.py's adjective-noun pairs (RULER: every wonderwords adjective x noun); distractor
  needles draw keys other than the asked ones, so the answer stays unique;
- the essay haystack is our corpus (RULER: Paul Graham's essays), split into sentences by
  needle.py's splitter (RULER: nltk's ``sent_tokenize``);
- cwe's words are the corpus's lower-case words of 4-12 letters, less the words of cwe's own
  template (RULER: wonderwords' nouns, adjectives and verbs, then a larger English list where a
  context needs more); past the corpus's words it takes coded 7-letter words;
- positions in a noise or needle haystack are uniform fractions of it (RULER: distinct indexes),
  so they hold still while the search changes the haystack's size.
"""
from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from typing import Callable

import torch

from harness.tasks.needle import ADJECTIVES, NEEDLE, NOUNS, RULER_WORDING, sentences

#: RULER's noise haystack (niah.py, variable_tracking.py): one unit, repeated
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
#: RULER's tokens_to_generate by task family (constants.py); a context's length counts them
TOKENS_TO_GENERATE = {"niah": 128, "vt": 30, "cwe": 120, "fwe": 50}
#: the templates of constants.py cut at ``{context}``: (before, after, answer prefix). RULER joins the
#: answer prefix with a leading space (its 'base' model template); the rendering adds it.
TEMPLATES = {
    "vt": ("Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n",
           "\nQuestion: Find all variables that are assigned the value {query} in the text above.",
           "Answer: According to the chain(s) of variable assignment in the text above, {num_v} variables are "
           "assigned the value {query}, they are: "),
    "cwe": ("Below is a numbered list of words. In these words, some appear more often than others. Memorize the "
            "ones that appear most often.\n",
            "\nQuestion: What are the 10 most common words in the above list?",
            "Answer: The top 10 words that appear most often in the list are:"),
    "fwe": ("Read the following coded text and track the frequency of each coded word. Find the three most "
            "frequently appeared coded words. ",
            "\nQuestion: Do not provide any explanation. Please ignore the dots '....'. What are the three most "
            "frequently appeared words in the above coded text?",
            "Answer: According to the coded text above, the three most frequently appeared words are:"),
}
KEYS = tuple(f"{a}-{n}" for a in ADJECTIVES for n in NOUNS)
DEPTHS = tuple(round(100 * i / 39) for i in range(40))  # RULER: np.round(np.linspace(0, 100, 40)), in percent
CHUNK = 256  # distractors drawn per generator
VT_HOPS = 4  # synthetic.yaml: 1 chain of 4 hops
VT_ICL_TOKENS = 500  # variable_tracking.py fits its one in-context example to 500 tokens
CWE_NUM, CWE_FREQ, CWE_FREQ_RARE = 10, 30, 3  # synthetic.yaml: num_cw, freq_cw, freq_ucw
FWE_ALPHA = 2.0  # synthetic.yaml: the zeta distribution's alpha


@dataclass(frozen=True)
class Niah:
    """One niah task of synthetic.yaml: the haystack ('noise', 'essay' or 'needle': distractor needles),
    the kinds of keys ('words', 'uuids') and values ('numbers', 'uuids'), and how many keys are hidden
    (k), values per key (v) and keys asked (q)."""
    haystack: str
    keys: str
    values: str
    k: int = 1
    v: int = 1
    q: int = 1


NIAH = {
    "niah_single_1": Niah("noise", "words", "numbers"),
    "niah_single_2": Niah("essay", "words", "numbers"),
    "niah_single_3": Niah("essay", "words", "uuids"),
    "niah_multikey_1": Niah("essay", "words", "numbers", k=4),
    "niah_multikey_2": Niah("needle", "words", "numbers"),
    "niah_multikey_3": Niah("needle", "uuids", "uuids"),
    "niah_multivalue": Niah("essay", "words", "numbers", v=4),
    "niah_multiquery": Niah("essay", "words", "numbers", q=4),
}
#: RULER's 13 synthetic tasks less its two QA ones, in synthetic.yaml's order
RULER_TASKS = (*NIAH, "vt", "cwe", "fwe")


def family(task: str) -> str:
    """The task's family in RULER's constants.py (its template, tokens_to_generate and metric)."""
    return "niah" if task in NIAH else task


@dataclass(frozen=True)
class Corpus:
    """What the tasks take from our text: ``words``, its words in order (the essay haystack), and
    ``pool``, cwe's distinct words (sorted)."""
    words: tuple[str, ...]
    pool: tuple[str, ...]

    @classmethod
    def load(cls, source: str | None) -> Corpus:
        """From ``--prompts`` (``source``; None: the offline default corpus)."""
        from harness.tasks.text_corpus import load_excerpts

        excerpts = load_excerpts(source, chars=200_000, limit=None if not source else 4)
        return cls.of([e.text for e in excerpts])

    @classmethod
    def of(cls, texts: list[str]) -> Corpus:
        text = " ".join(texts)
        own = set(re.findall(r"[a-z]+", " ".join(TEMPLATES["cwe"]).lower()))  # the question must not hold one
        pool = sorted(set(re.findall(r"\b[a-z]{4,12}\b", text)) - own)
        return cls(tuple(text.split()), tuple(pool))


@dataclass(frozen=True)
class Draft:
    """One sample before its haystack's size is fixed. ``user(n)`` -> (the user turn up to the end of
    the context, the rest of it: the question) around a haystack of ``n`` units; ``answer_prefix``
    opens the answer (RULER's, without its leading space); ``answers``: the reference strings;
    ``unit``: what ``n`` counts ('noise sentences', ...), for messages."""
    family: str
    user: Callable[[int], tuple[str, str]]
    answer_prefix: str
    answers: tuple[str, ...]
    unit: str
    keys: tuple[str, ...] = ()  # niah: the keys asked, in the order asked

# --- random draws ------------------------------------------------------------------------------
def numbers(g: torch.Generator, n: int) -> list[str]:
    """``n`` 7-digit numbers (RULER: random.randint(10**6, 10**7 - 1))."""
    return [str(v) for v in torch.randint(10 ** 6, 10 ** 7, (n,), generator=g).tolist()]


def uuids(g: torch.Generator, n: int) -> list[str]:
    """``n`` random version-4 UUIDs, from 128 random bits each, as RULER's uuid.UUID(int=getrandbits(128))."""
    words = torch.randint(0, 1 << 32, (n, 4), generator=g, dtype=torch.int64).tolist()
    return [str(uuid.UUID(int=(a << 96) | (b << 64) | (c << 32) | d, version=4)) for a, b, c, d in words]


def coded_words(g: torch.Generator, count: int, length: int, exclude=()) -> list[str]:
    """``count`` distinct random lower-case words of ``length`` letters, none in ``exclude``, in draw
    order. Drawn in fixed batches, so a fresh generator gives the same first words for any count."""
    out, seen = [], set(exclude)
    while len(out) < count:
        for row in torch.randint(0, 26, (CHUNK, length), generator=g).tolist():
            w = "".join(chr(97 + c) for c in row)
            if w not in seen:
                seen.add(w)
                out.append(w)
    return out[:count]


def shuffled(items: list, g: torch.Generator) -> list:
    return [items[i] for i in torch.randperm(len(items), generator=g).tolist()]


def scatter(lines: list[str], where: list[float], items: list[str]) -> list[str]:
    """``lines`` with ``items`` inserted, in their order, before the lines at the fractions ``where`` of
    them (RULER inserts at sorted indexes, highest first; equal ones stay in order)."""
    out = list(lines)
    at = sorted(int(f * len(lines)) for f in where)
    for i, item in reversed(list(zip(at, items))):  # the last first: earlier items at an equal index stay ahead
        out.insert(i, item)
    return out


def zeta(a: float, terms: int = 1000) -> float:
    """Riemann zeta(a) for a > 1: ``terms`` terms summed and the tail by Euler-Maclaurin (error below 1e-12)."""
    n = terms
    return sum(k ** -a for k in range(1, n)) + n ** (1 - a) / (a - 1) + n ** -a / 2 + a * n ** (-a - 1) / 12


def base_prompt(before: str, context: str, after: str, answer_prefix: str) -> str:
    """A template filled as RULER fills it for its 'base' model template (answer prefix after a space):
    the form of its in-context examples."""
    return f"{before}{context}{after} {answer_prefix}"


# --- fitting ----------------------------------------------------------------------------------------
def fit(tokens: Callable[[int], int], budget: int, probe: int = 16) -> int:
    """The largest ``n`` >= 0 with ``tokens(n) <= budget`` (``tokens`` grows with ``n``), or -1 where
    even ``n = 0`` does not fit. Gallops from an estimate (``tokens`` of 0 and ``probe`` units), then
    bisects; each ``tokens(n)`` is asked once."""
    seen: dict[int, int] = {}

    def fits(n: int) -> bool:
        if n not in seen:
            seen[n] = tokens(n)
        return seen[n] <= budget

    if not fits(0):
        return -1
    most = 8 * budget + 64  # every unit adds tokens: a haystack this large cannot fit
    fits(probe)
    per = max((seen[probe] - seen[0]) / probe, 1e-3)
    n, step = max(1, min(most, int((budget - seen[0]) / per))), max(1, probe // 2)
    lo, hi = (n, None) if fits(n) else (0, n)
    while hi is None:  # fits(lo): step up, doubling, until a size does not fit
        if lo >= most:
            raise RuntimeError(f"ruler: a haystack of {lo} units still fits {budget} tokens; it stopped growing")
        if fits(lo + step):
            lo, step = lo + step, 2 * step
        else:
            hi = lo + step
    while lo == 0 and hi - step > 0:  # the estimate did not fit: step down, doubling, until a size fits
        if fits(hi - step):
            lo = hi - step
        else:
            hi, step = hi - step, 2 * step
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


# --- the tasks -----------------------------------------------------------------------------------
def draft(task: str, gen: Callable[..., torch.Generator], corpus: Corpus, context: int,
          count: Callable[[str], int]) -> Draft:
    """The :class:`Draft` of RULER task ``task`` for a context of ``context`` tokens; ``count(text)``:
    the model's tokens in a plain text (vt fits its in-context example with it)."""
    if task in NIAH:
        return niah(NIAH[task], gen, corpus)
    if task == "vt":
        return _vt(gen, count)
    if task == "cwe":
        return _cwe(gen, corpus, context)
    if task == "fwe":
        return _fwe(gen, context)
    raise ValueError(f"unknown RULER task '{task}'. Available: {', '.join(RULER_TASKS)}")


def _values(kind: str, g: torch.Generator, n: int) -> list[str]:
    return numbers(g, n) if kind == "numbers" else uuids(g, n)


def niah(spec: Niah, gen, corpus: Corpus) -> Draft:
    g = gen()
    k = max(spec.k, spec.q)
    picked = torch.randperm(len(KEYS), generator=g)[:k].tolist()
    keys = [KEYS[i] for i in picked] if spec.keys == "words" else uuids(g, k)
    values = [_values(spec.values, g, spec.v) for _ in keys]
    needle = NEEDLE.replace("numbers", spec.values)
    needles = shuffled([needle.format(key=key, value=v) for key, vs in zip(keys, values) for v in vs], g)
    asked = torch.randperm(k, generator=g)[:spec.q].tolist()
    query = ", ".join(keys[i] for i in asked[:-1]) + ", and " + keys[asked[-1]] if len(asked) > 1 else keys[asked[0]]
    answers = tuple(v for i in asked for v in values[i])
    depths = sorted(DEPTHS[i] for i in torch.randperm(len(DEPTHS), generator=g)[:len(needles)].tolist())
    where = torch.rand(len(needles), generator=g).tolist()
    # RULER's wording, singular where one value is asked; its placeholder is the value's kind
    instruction, question, prefix = (s.replace("number", spec.values[:-1]) for s in RULER_WORDING[len(answers) > 1])
    taken = set(picked)
    others = [key for i, key in enumerate(KEYS) if i not in taken]
    distractors: list[str] = []

    def more(n: int) -> list[str]:  # the first n distractor needles, drawn chunk by chunk
        while len(distractors) < n:
            h = gen("haystack", len(distractors) // CHUNK)
            ks = ([others[i] for i in torch.randint(0, len(others), (CHUNK,), generator=h).tolist()]
                  if spec.keys == "words" else uuids(h, CHUNK))
            distractors.extend(needle.format(key=a, value=b) for a, b in zip(ks, _values(spec.values, h, CHUNK)))
        return distractors[:n]

    def user(n: int) -> tuple[str, str]:
        if spec.haystack == "essay":
            sents = sentences(" ".join(corpus.words[i % len(corpus.words)] for i in range(n)))
            context = " ".join(scatter(sents, [d / 100 for d in depths], needles))
        else:
            context = "\n".join(scatter([NOISE] * n if spec.haystack == "noise" else more(n), where, needles))
        return f"{instruction}\n{context}", f"\n{question.format(key=query)}"

    unit = {"essay": "essay words", "noise": "noise sentences", "needle": "distractor needles"}[spec.haystack]
    return Draft("niah", user, prefix.format(key=query), answers, unit, tuple(keys[i] for i in asked))


def _vt(gen, count: Callable[[str], int]) -> Draft:
    g = gen()
    before, after, prefix = TEMPLATES["vt"]

    def chain(length: int):
        names = [w.upper() for w in coded_words(g, VT_HOPS + 1, length, exclude=("var",))]
        value = str(int(torch.randint(10000, 99999, (1,), generator=g)))  # RULER: np.random.randint(10000, 99999)
        lines = [f"VAR {names[0]} = {value}"] + [f"VAR {b} = VAR {a} " for a, b in zip(names, names[1:])]
        where = torch.rand(len(lines), generator=g).tolist()

        def user(n: int) -> tuple[str, str]:
            return before + "\n".join(scatter([NOISE] * n, where, lines)), after.format(query=value)
        return names, user, prefix.format(num_v=VT_HOPS + 1, query=value)

    names, user, answer_prefix = chain(5)
    # RULER's one in-context example: a chain of 3-letter names in a noise haystack fitted to 500 tokens,
    # followed by its answer
    icl_names, icl_user, icl_prefix = chain(3)

    def example(n: int) -> str:
        head, tail = icl_user(n)
        return base_prompt(head, "", tail, icl_prefix)

    icl_n = fit(lambda n: count(example(n)), VT_ICL_TOKENS)
    if icl_n < 0:
        raise ValueError(f"ruler: vt's in-context example does not fit its {VT_ICL_TOKENS} tokens in this tokenizer")
    icl = example(icl_n) + " ".join(icl_names) + "\n"  # its answer prefix ends 'they are: '

    def with_example(n: int) -> tuple[str, str]:
        head, tail = user(n)
        return f"{icl}\n{head}", tail

    return Draft("vt", with_example, answer_prefix, tuple(names), "noise sentences")


def _numbered(words: list[str]) -> str:
    return " ".join(f"{i + 1}. {w}" for i, w in enumerate(words))


def _cwe(gen, corpus: Corpus, context: int) -> Draft:
    g = gen()
    before, after, prefix = TEMPLATES["cwe"]
    # RULER's settings below 4096 tokens of context: fewer repeats, a smaller example
    (shot_n, shot_freq, shot_rare), (freq, rare) = (((20, 3, 1), (6, 1)) if context < 4096 else
                                                    ((40, 10, 3), (CWE_FREQ, CWE_FREQ_RARE)))
    if len(corpus.pool) < shot_n:
        raise ValueError(f"ruler: cwe needs at least {shot_n} distinct words of 4-12 letters; the text has "
                         f"{len(corpus.pool)}")
    order = shuffled(list(corpus.pool), g)
    shot = shuffled(list(corpus.pool), g)[:shot_n]
    shot_list = shuffled(shot[:CWE_NUM] * shot_freq + shot[CWE_NUM:] * shot_rare, g)
    example = base_prompt(before, _numbered(shot_list), after, prefix) + " " + _numbered(shot[:CWE_NUM])
    coded: list[str] = []

    def words(n: int) -> list[str]:  # the corpus's words in drawn order, then coded words where it runs out
        need = CWE_NUM + n - len(order)
        if need > len(coded):
            coded[:] = coded_words(gen("cwe-words"), max(need, 2 * len(coded)), 7, exclude=corpus.pool)
        return (order + coded)[:CWE_NUM + n]

    def user(n: int) -> tuple[str, str]:
        w = words(n)
        listed = shuffled(w[:CWE_NUM] * freq + w[CWE_NUM:] * rare, gen("n", n))
        return f"{example}\n{before}{_numbered(listed)}", after

    return Draft("cwe", user, prefix, tuple(order[:CWE_NUM]), "uncommon words")


def _fwe(gen, context: int) -> Draft:
    g = gen()
    before, after, prefix = TEMPLATES["fwe"]
    size = (context - TOKENS_TO_GENERATE["fwe"]) // 50  # RULER's vocab_size
    if size < 4:
        raise ValueError(f"ruler: fwe at context {context} has a vocabulary of {size} coded words; it needs 4 "
                         f"(a context of at least {4 * 50 + TOKENS_TO_GENERATE['fwe']} tokens)")
    vocab = ["..."] + coded_words(g, size - 1, 6)  # RULER: the top-ranked word is noise, '...'
    z = zeta(FWE_ALPHA)
    share = [k ** -FWE_ALPHA / z for k in range(1, size + 1)]

    def user(n: int) -> tuple[str, str]:
        text = [w for w, p in zip(vocab, share) for _ in range(int(n * p))]
        return before + " ".join(shuffled(text, gen("n", n))), after

    return Draft("fwe", user, prefix, tuple(vocab[1:4]), "coded words")
