import torch

from course_lib.core import data
from course_lib.core.model import build_model, count_tokens, loss_sum


def test_model_size_and_determinism(cfg):
    a, b = build_model(cfg), build_model(cfg)
    assert 100_000 <= sum(p.numel() for p in a.parameters()) <= 300_000
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)
    torch.manual_seed(0)  # the global RNG does not leak into the init
    c = build_model(cfg)
    assert all(torch.equal(pa, pc) for pa, pc in zip(a.parameters(), c.parameters()))


def test_loss_sum_is_a_sum_and_ignores_padding(cfg, corpus):
    model = build_model(cfg).eval()
    short, long_ = 0, max(range(50), key=lambda i: len(corpus.sequences[i]))
    alone_in, alone_lab = data.collate(corpus, [short])
    padded_in, padded_lab = data.collate(corpus, [short, long_])
    with torch.no_grad():
        alone = loss_sum(model(alone_in), alone_lab)
        both_logits = model(padded_in)
        first_row = loss_sum(both_logits[:1], padded_lab[:1])
    assert padded_in.shape[1] > alone_in.shape[1], "the short sequence got padded"
    assert torch.allclose(alone, first_row, atol=1e-5)
    assert int(count_tokens(padded_lab[:1])) == len(corpus.sequences[short]) - 1


def test_count_is_what_the_loss_uses(cfg, corpus):
    """Ignored labels (a prompt, say) change both the count and the sum."""
    model = build_model(cfg).eval()
    inputs, labels = data.collate(corpus, [3, 4])
    masked = labels.clone()
    masked[:, :5] = data.IGNORE_INDEX
    with torch.no_grad():
        logits = model(inputs)
        noisy = logits.clone()
        noisy[:, :5] += 100.0 * torch.randn_like(noisy[:, :5])
    assert int(count_tokens(masked)) == int(count_tokens(labels)) - 10
    # Whatever the model predicts at ignored positions, the loss does not move.
    assert torch.allclose(loss_sum(logits, masked), loss_sum(noisy, masked))
    assert not torch.allclose(loss_sum(logits, labels), loss_sum(noisy, labels))
