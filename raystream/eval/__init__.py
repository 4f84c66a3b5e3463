"""raystream.eval: evaluations of frozen models, pure PyTorch (no Ray, no MLflow).

    knn_top1(train_f, train_y, test_f, test_y, num_classes=None, *, k=20, temperature=0.07) -> float
    linear_probe_top1(train_f, train_y, test_f, test_y, num_classes=None, *, epochs=100, optimizer="lbfgs", ...)
    attentive_probe_top1(train_tokens, train_y, test_tokens, test_y, num_classes=None, *, epochs=20, ...)
    psnr(pred, target, data_range=1.0) -> Tensor   (mean per-sample PSNR, predictions clamped to [0, 1])
    probe_metrics(encode, probe_source, eval_cfg) -> {'eval/knn_top1', ...}: the probes of eval.protocol
        (default, dino: DINO's kNN at 4 k + linear probe, vjepa: V-JEPA's attentive + linear probe)
    load_probe_source(data_cfg, stream_cfg, eval_cfg) -> ProbeSource: eval.dataset as published (ImageFolder,
        SSv2, `path label` lists) or labelled video folders
    heldout_pixel_metrics(predict, batches, max_batches) -> {'eval/mse_out_of_stream', 'eval/psnr_out_of_stream'}

    probes.py             the probes of `eval.metrics` on a labelled probe set with a frozen encoder (probe_metrics)
    knn.py                weighted kNN on frozen features, as DINO's eval_knn.py
    linear.py             the linear probe on cached frozen features
    attentive.py          the attentive probe on frozen tokens, as V-JEPA's AttentiveClassifier
    minibatch.py          the seeded mini-batch order of the probes that train with mini-batches
    pixels.py             pixel-prediction metrics: MSE and PSNR, in and out of the stream
    views.py              the views a probe sees of an image: DINO's evaluation transforms
    loaders.py            probe samples -> pixels, one list of samples at a time
    probe_sets.py         probe sets as their authors publish them (ImageFolder, SSv2, `path label` lists), listed
    labelled_videos.py    labelled video folders as probe sets: clips with class labels
    shard.py              which part of a probe's work this process does, and the collectives joining the parts
    config.py             EvalConfig: the `eval` section (plain data)
"""

from raystream.eval.attentive import attentive_probe_top1
from raystream.eval.knn import knn_top1
from raystream.eval.linear import linear_probe_top1
from raystream.eval.pixels import heldout_pixel_metrics, pixel_metrics, psnr
from raystream.eval.probes import probe_metrics

__all__ = ["knn_top1", "linear_probe_top1", "attentive_probe_top1", "psnr", "pixel_metrics",
           "heldout_pixel_metrics", "probe_metrics"]
