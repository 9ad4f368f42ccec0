"""The data: the synthetic corpus and its lock (``corpus``), the rank plan
(``plan``) and padding (``collate``). The names below are the ones the
rest of the package and the chapters use."""

from course_lib.core.data.collate import IGNORE_INDEX, Packing, collate
from course_lib.core.data.corpus import (
    FORMAT_VERSION,
    Corpus,
    DataLockError,
    MarkovSource,
    corpus_id,
    corpus_paths,
    generate_corpus,
    generated_home,
    load_corpus,
    locate,
    lock_record,
    make_source,
    prepare,
    write_corpus,
)
from course_lib.core.data.plan import (
    WindowSampler,
    check_plan,
    make_plan,
    make_sampler,
    parity_window,
    rank_bands,
    rank_pools,
    sampler_plan,
)

__all__ = ["FORMAT_VERSION", "IGNORE_INDEX", "Corpus", "DataLockError", "MarkovSource",
           "Packing", "WindowSampler", "check_plan", "collate", "corpus_id", "corpus_paths",
           "generate_corpus", "generated_home", "load_corpus", "locate", "lock_record",
           "make_plan", "make_sampler", "make_source", "parity_window", "prepare",
           "rank_bands", "rank_pools", "sampler_plan", "write_corpus"]
