"""The engine benchmark's workload and its two baselines.

N villagers (agents) share one ~410-token world-lore prefix; each gets a
private ~40-token question and generates 64 tokens, greedy, on Gemma 3 270M
with 2 threads. The baselines are what a user would otherwise run, both on
llama-cpp-python's high-level `Llama` with the same model and threads:

- serialised: each agent alone with its own full prefill, one after
  another (the original product: inference serialised, a cache per agent);
- prompt_cache: one after another, but each prompt reuses the KV of the
  longest common prefix with the previous one (llama-server's prompt cache),
  so only the first agent pays for the lore.
"""
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = "Gemma-3-270M"
MAX_TOKENS = 64
N_THREADS = 2
FLASH_ATTN = 1     # llama_flash_attn_type: enabled, for the engine and both baselines

_FACTS = [
    "The mayor, Oswin Hale, has ruled for eleven years and fears the northern barons.",
    "The blacksmith Tamsin forges blades from bog iron and sells them at the spring fair.",
    "The Prancing Pony inn serves dark ale brewed by the widow Marla and her two sons.",
    "A ruined watchtower on the eastern ridge is said to hide a dragon's egg.",
    "Merchants arrive every ninth day with salt, silk and news from the coast.",
    "The temple of the Lantern keeps a flame that has burned for three hundred years.",
    "Wolves have taken sheep from the high pastures twice since the first snow.",
    "The old bridge collapsed last autumn and the ferryman charges two coppers a crossing.",
    "Children are warned never to follow lights into the Fenwood after dusk.",
    "The miller's daughter Ysolde is betrothed to a soldier who has not written in a year.",
    "A bounty of fifty crowns is posted for the bandit called the Grey Fox.",
    "The harvest was poor, and bread now costs twice what it did at midsummer.",
]
_NAMES = ["Brenna", "Tamsin", "Oswin", "Marla", "Ysolde", "Corwin", "Edda", "Fenn"]
_QUESTIONS = [
    "Where can a tired traveller find a warm bed and a hot meal tonight?",
    "Who would buy a fine sword, and what would they pay for it?",
    "Is it safe to cross the river now that the old bridge is gone?",
    "What do the townsfolk whisper about the ruined watchtower on the ridge?",
    "Why has the price of bread risen so much since the summer?",
    "Have you seen the bandit they call the Grey Fox anywhere near here?",
    "What should a stranger know before walking into the Fenwood at night?",
    "When do the merchants from the coast arrive, and what do they bring?",
]


def lore():
    """The shared prefix: the town's lore (~410 tokens on Gemma's tokenizer)."""
    text = "The town of Brindlemere sits where the river Aln meets the grey hills. "
    return text + " ".join(_FACTS + _FACTS[:11]) + "\n"


def private(i):
    """Agent i's own part of the prompt (~40 tokens)."""
    name = _NAMES[i % len(_NAMES)]
    q = _QUESTIONS[(i * 3) % len(_QUESTIONS)]
    return (f"\nVillager #{i} is {name}, who has lived in Brindlemere all their life.\n"
            f"A traveller asks {name}: \"{q}\"\n{name} answers:")


def prompts(n):
    base = lore()
    return base, [base + private(i) for i in range(n)]


def model_path():
    from tryll_fast.models import ensure_model
    return str(ensure_model(MODEL, os.path.join(ROOT, "build", "models")))


class HighLevelBaseline:
    """llama-cpp-python's `Llama`, driven the two ways a user would, with the settings of
    the engine under test: same threads, batch, flash attention (enabled on both sides,
    FLASH_ATTN) and greedy sampling.

    Generation goes through `Llama.generate()`, taking exactly MAX_TOKENS tokens and not
    stopping at end-of-sequence, as ours runs with ignore_eos. Not `create_completion()`
    with a logit bias against EOS: that bias runs as a Python logits processor copying
    the whole vocabulary's logits every token, a cost our engine never pays."""

    def __init__(self, path, n_ctx=2048):
        from llama_cpp import Llama
        self.llm = Llama(path, n_ctx=n_ctx, n_batch=512, n_threads=N_THREADS,
                         n_threads_batch=N_THREADS, flash_attn=FLASH_ATTN == 1,
                         verbose=False)

    def _complete(self, prompt):
        tokens = self.llm.tokenize(prompt.encode("utf-8"), add_bos=True, special=True)
        n = 0
        for _ in self.llm.generate(tokens, temp=0.0):
            n += 1
            if n == MAX_TOKENS:
                break
        return n

    def serialised(self, prompts):
        """Every agent from scratch: full prefill each time."""
        total = 0
        for p in prompts:
            self.llm.reset()
            total += self._complete(p)
        return total

    def prompt_cache(self, prompts):
        """One after another, reusing the longest common prefix's KV (generate() keeps
        the matching head of the previous prompt)."""
        self.llm.reset()
        return sum(self._complete(p) for p in prompts)

    def close(self):
        self.llm.close()
