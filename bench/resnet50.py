"""ResNet-50 benchmarks: analysis speed and memory (issue: within 2x of torch.export +
decomposition, peak < 1 GB) and full-size validation time (batch 10, 224x224, < 60 s).

    python bench/resnet50.py --batch 256            # analysis speed and peak memory
    python bench/resnet50.py --batch 10 --validate  # validation at full size

ResNet-50 is written here (torchvision from PyPI does not import beside the CPU torch wheel).
"""

from __future__ import annotations

import argparse
import resource
import time

import torch
import torch.nn as nn


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, width: int, stride: int = 1):
        super().__init__()
        cout = width * self.expansion
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False),
                                      nn.BatchNorm2d(cout))

    def forward(self, x):
        idt = x if self.down is None else self.down(x)
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return self.relu(y + idt)


class ResNet50(nn.Module):
    def __init__(self, classes: int = 1000):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64),
                                  nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1))
        layers, cin = [], 64
        for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
            for i in range(blocks):
                layers.append(Bottleneck(cin, width, stride if i == 0 else 1))
                cin = width * 4
        self.layers = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(2048, classes)

    def forward(self, x):
        return self.fc(torch.flatten(self.pool(self.layers(self.stem(x))), 1))


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--validate", action="store_true")
    ap.add_argument("--eval", action="store_true", help="eval mode (default: training mode)")
    a = ap.parse_args()
    import solbound
    from solbound.frontends.torch.capture import export_program

    dev = "cpu" if a.validate else "meta"
    with torch.device(dev):
        torch.manual_seed(0)
        model = ResNet50()
        x = torch.randn(a.batch, 3, 224, 224)
    if a.eval:
        model.eval()
    rss0 = peak_rss_mb()
    # warm torch.export up (its first call in a process pays one-time costs), then time
    # export + decomposition alone and the whole analysis on equal terms
    with torch.device("meta"):
        export_program(nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)),
                       (torch.empty(1, 3, 8, 8),))
    t0 = time.perf_counter()
    export_program(model, (x,))
    t_export = time.perf_counter() - t0
    t0 = time.perf_counter()
    rep = solbound.analyze(model, (x,), arch="h100-sxm", validate=a.validate)
    t_total = time.perf_counter() - t0
    tm = rep.timings
    print(f"ResNet-50 batch {a.batch} ({'eval' if a.eval else 'train'} mode), device={dev}")
    print(f"  torch.export + decomposition alone: {t_export:.2f} s")
    print(f"  solbound analyze:                   {t_total:.2f} s "
          f"(export {tm['export_s']:.2f} + lower {tm['lower_s']:.2f} + counts/bounds "
          f"{tm['analysis_s']:.2f}) = {t_total / t_export:.2f}x export")
    print(f"  peak RSS: {peak_rss_mb():.0f} MB (before analysis {rss0:.0f} MB)")
    t = rep.to_dict()["totals"]
    print(f"  MACs {t['macs'] / 1e9:.2f} G, FLOPs {t['flops'] / 1e9:.2f} G, bytes unfused "
          f"{t['bytes']['unfused'] / 1e9:.2f} GB, fused {t['bytes']['fused'] / 1e9:.2f} GB")
    for b in rep.bounds:
        print(f"  {b.arch} {b.mode}: {b.seconds * 1e3:.3f} ms ({b.bound}-bound)")
    if a.validate:
        v = rep.validation
        print(f"  validation: {v['status']} in {v.get('seconds', 0):.1f} s; {v.get('summary', v.get('reason'))}")
        worst = sorted(v.get("outputs", []), key=lambda o: -(o["worst_rel_error"] or 0))[:3]
        for o in worst:
            print(f"    {o['output']}: {o['worst_rel_error']:.3g}")


if __name__ == "__main__":
    main()
