"""The attentive probe is V-JEPA's AttentiveClassifier (depth 1): checked parameter by parameter and output by output
against a reference written out here from V-JEPA's src/models/attentive_pooler.py, with the same weights."""

import math

import torch
import torch.nn.functional as F

from raystream.eval.attentive import AttentiveClassifier


def reference_forward(p, x, heads):
    """V-JEPA's AttentiveClassifier.forward, written with plain tensor ops on the parameters `p`."""
    b, n, d = x.shape
    q = p["pooler.query_tokens"].repeat(b, 1, 1)
    xn = F.layer_norm(x, (d,), p["pooler.cross_attention_block.norm1.weight"],
                      p["pooler.cross_attention_block.norm1.bias"])
    qq = (q @ p["pooler.cross_attention_block.xattn.q.weight"].T + p["pooler.cross_attention_block.xattn.q.bias"])
    kv = xn @ p["pooler.cross_attention_block.xattn.kv.weight"].T + p["pooler.cross_attention_block.xattn.kv.bias"]
    k, v = kv[..., :d], kv[..., d:]
    hd = d // heads
    qq = qq.reshape(b, 1, heads, hd).transpose(1, 2)
    k = k.reshape(b, n, heads, hd).transpose(1, 2)
    v = v.reshape(b, n, heads, hd).transpose(1, 2)
    att = ((qq @ k.transpose(-2, -1)) / math.sqrt(hd)).softmax(-1)
    y = (att @ v).transpose(1, 2).reshape(b, 1, d)
    y = y @ p["pooler.cross_attention_block.xattn.proj.weight"].T + p["pooler.cross_attention_block.xattn.proj.bias"]
    q = q + y
    qn = F.layer_norm(q, (d,), p["pooler.cross_attention_block.norm2.weight"],
                      p["pooler.cross_attention_block.norm2.bias"])
    h = F.gelu(qn @ p["pooler.cross_attention_block.mlp.0.weight"].T + p["pooler.cross_attention_block.mlp.0.bias"])
    q = q + (h @ p["pooler.cross_attention_block.mlp.2.weight"].T + p["pooler.cross_attention_block.mlp.2.bias"])
    return q[:, 0] @ p["linear.weight"].T + p["linear.bias"]


def test_parameters_and_forward_match_vjepa_attentive_classifier():
    d, heads, classes = 48, 6, 5
    torch.manual_seed(0)
    probe = AttentiveClassifier(d, classes, num_heads=heads)
    shapes = {k: tuple(v.shape) for k, v in probe.state_dict().items()}
    c = "pooler.cross_attention_block."
    assert shapes == {
        "pooler.query_tokens": (1, 1, d),
        c + "norm1.weight": (d,), c + "norm1.bias": (d,),
        c + "xattn.q.weight": (d, d), c + "xattn.q.bias": (d,),
        c + "xattn.kv.weight": (2 * d, d), c + "xattn.kv.bias": (2 * d,),
        c + "xattn.proj.weight": (d, d), c + "xattn.proj.bias": (d,),
        c + "norm2.weight": (d,), c + "norm2.bias": (d,),
        c + "mlp.0.weight": (4 * d, d), c + "mlp.0.bias": (4 * d,),
        c + "mlp.2.weight": (d, 4 * d), c + "mlp.2.bias": (d,),
        "linear.weight": (classes, d), "linear.bias": (classes,),
    }
    assert probe.pooler.cross_attention_block.xattn.num_heads == heads
    # random values everywhere (LayerNorms and biases too), so every term of the forward counts
    with torch.no_grad():
        for prm in probe.parameters():
            prm.copy_(torch.randn_like(prm) * 0.3)
    x = torch.randn(3, 11, d)
    params = {k: v.detach() for k, v in probe.state_dict().items()}
    torch.testing.assert_close(probe(x), reference_forward(params, x, heads), rtol=1e-5, atol=1e-5)
    # another head count changes the output: the heads are the given ones
    other = AttentiveClassifier(d, classes, num_heads=3)
    other.load_state_dict(probe.state_dict())
    assert not torch.allclose(other(x), probe(x), atol=1e-4)


def test_initialisation_follows_vjepa():
    torch.manual_seed(0)
    probe = AttentiveClassifier(96, 4, num_heads=3)
    block = probe.pooler.cross_attention_block
    assert torch.equal(block.norm1.weight, torch.ones(96)) and torch.equal(block.mlp[0].bias, torch.zeros(384))
    assert abs(float(block.xattn.q.weight.detach().std()) - 0.02) < 0.004
    assert abs(float(block.xattn.proj.weight.detach().std()) - 0.02 / math.sqrt(2)) < 0.003  # rescaled by depth (1)
    assert 0.01 < float(probe.pooler.query_tokens.detach().std()) < 0.03
