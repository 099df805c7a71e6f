"""A model folder's tokenizer, loaded the same way by the workers and the router.

transformers' `AutoTokenizer` imports torch whenever torch is installed (its config classes do),
although a tokenizer needs none. Most models declare the generic tokenizer class (their
`tokenizer.json` is the whole tokenizer): for those, AutoTokenizer itself returns
`PreTrainedTokenizerFast`, so loading that class directly gives the very same tokenizer without
torch. That keeps the router, which only tokenizes and renders chat templates, torch-free. A model
that declares its own class (e.g. `Qwen2Tokenizer`) goes through AutoTokenizer, as before.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)

# The names AutoTokenizer resolves to transformers' generic tokenizer (tokenizer.json as is) for
# the model families pdserve runs (core/model/config.py SUPPORTED_ARCHITECTURES).
GENERIC_TOKENIZER_CLASSES = frozenset({"TokenizersBackend", "PreTrainedTokenizerFast"})


def declared_tokenizer_class(model_dir: Path) -> str | None:
    """`tokenizer_class` from the folder's tokenizer_config.json, if it names one."""
    config_file = model_dir / "tokenizer_config.json"
    if not config_file.is_file():
        return None
    declared = json.loads(config_file.read_text()).get("tokenizer_class")
    return declared if isinstance(declared, str) else None


def load_tokenizer(model_dir: Path) -> PreTrainedTokenizerBase:
    """The tokenizer AutoTokenizer would load for `model_dir`; torch-free for generic ones."""
    declared = declared_tokenizer_class(model_dir)
    if declared in GENERIC_TOKENIZER_CLASSES:
        from transformers import PreTrainedTokenizerFast

        generic: PreTrainedTokenizerBase = PreTrainedTokenizerFast.from_pretrained(str(model_dir))
        return generic
    log.info("tokenizer class %s: loaded by AutoTokenizer (imports torch if installed)", declared)
    from transformers import AutoTokenizer

    tokenizer: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(str(model_dir))
    return tokenizer
