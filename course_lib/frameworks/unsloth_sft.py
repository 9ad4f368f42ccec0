"""Unsloth: TRL's ``SFTTrainer`` with Unsloth's patches, which it applies to
transformers and TRL, for the whole process, when it is imported (its own
``get_batch_samples`` and loss among them). So it is audited alone in its
job (``exclusive``), and imported before the model is built, as Unsloth
asks. On a machine without a GPU, Unsloth trains on the CPU."""

from __future__ import annotations

from course_lib.frameworks.trl_sft import TRLAdapter


class UnslothAdapter(TRLAdapter):
    package = "unsloth"
    exclusive = True  # it patches the frameworks of every later configuration
    modules: tuple[str, ...] = ()  # it must be imported before transformers

    def load(self) -> None:
        """Before transformers builds the model (``frameworks.load_first``):
        Unsloth patches it on import."""
        import unsloth  # noqa: F401


ADAPTER = UnslothAdapter()
