"""A serving question, declared once: every option of ``serve`` is one field of :class:`ServeQuestion`, declared with
``step.option`` as the step question's are (its kind and check, help, the user's default). ``serve``'s CLI options,
``cost.serving.question``'s keywords and the serving sweep's columns are generated from these fields.

A serving question is answered through step questions (``cost/serving.py``): a decode step of ``concurrency``
sequences and a prefill of one prompt, on ``tp`` GPUs, in ``dtype``; its model and device are the step question's.

No torch, no pandas: the CLI's parser reads this module.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from neusight_core.question.schema import Precision, ServingEngine
from neusight_core.question.step import COVERAGE_LIMITS, Choice, Count, Kind, Share, option, options


@dataclass(frozen=True, kw_only=True)
class ServeQuestion:
    """A validated serving question (built by ``cost.serving.question``): ``concurrency`` requests in flight, each a
    prompt of ``isl`` tokens answered with ``osl`` tokens, on one instance of ``engine`` over ``tp`` GPUs."""
    model: object = option(Kind(), help="config name (see `models`) or path to a HF config JSON",
                           many="model name(s) or config path(s), comma-separated")
    device: str = option(Kind(), help="GPU name, file stem or alias (see `devices`)",
                         many="GPU name(s), comma-separated")
    tp: int = option(Count(), user=1, what="tensor-parallel GPU count",
                     help="GPUs of one serving instance (tensor parallelism)", many="TP size(s), e.g. 1,2,4,8")
    dtype: Precision = option(Choice(Precision), user=Precision.BF16,
                              help="precision of the weights and GEMMs (serving engines run bf16 or lower)",
                              many="precision(s), comma-separated")
    engine: ServingEngine = option(Choice(ServingEngine), user=ServingEngine.VLLM,
                                   help="serving engine: its constants are fitted on its own measured runs "
                                        "(docs/serving.md)",
                                   many="serving engine(s), comma-separated")
    isl: int = option(Count(), user=1024, what="input length (ISL)", help="prompt tokens per request (ISL)",
                      many="prompt length(s), e.g. 1024,4096")
    osl: int = option(Count(2), user=1024, what="output length (OSL)", help="output tokens per request (OSL)",
                      many="output length(s), e.g. 128,1024")
    concurrency: int = option(Count(), user=32, what="concurrency",
                              help="requests in flight (each client sends its next request when its answer is in)",
                              many="concurrency level(s), e.g. 8,16,32,64")

    coverage: float = option(Share(COVERAGE_LIMITS), user=0.8, what="coverage",
                             help="the intervals' coverage, 0.5-0.99 (the spread of the engine's development rows "
                                  "around the model: docs/serving.md)",
                             many="coverage(s) of the intervals, 0.5-0.99, comma-separated")

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


#: the serving question's fields in declaration order: the serving sweep's input columns
SERVE_INPUTS = list(options(ServeQuestion))
