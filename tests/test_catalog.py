"""The hardware catalog's data files (``src/solbound/hardware/specs/*.toml``): every file
loads, every figure says where it comes from, and a few figures match the number their
data sheet prints (rates as printed: ``<id>@datasheet``, never scaled to another clock)."""

import os
import re
import tomllib

import pytest

from solbound.hardware import catalog as cat
from solbound.hardware.catalog import SECTION_KEYS, catalog, load_spec

SPECS = os.path.join(os.path.dirname(cat.__file__), cat.SPEC_DIR)
FILES = sorted(f for f in os.listdir(SPECS) if f.endswith(".toml"))
ENTRY_SECTIONS = (*SECTION_KEYS, "units")


def _raw(name):
    with open(os.path.join(SPECS, name), "rb") as f:
        return tomllib.load(f)


@pytest.mark.parametrize("name", FILES)
def test_every_spec_file_loads_and_sources_every_entry(name):
    data = _raw(name)
    spec_id = name.removesuffix(".toml")
    assert data["id"] == spec_id, "the file is named after its id"
    assert load_spec(spec_id).id == spec_id
    assert load_spec(os.path.join(SPECS, name)).id == spec_id      # the path form too
    assert load_spec(f"{spec_id}@datasheet").clocked == "datasheet"
    for key in ("name", "vendor", "kind", "notes"):
        assert isinstance(data.get(key), str) and data[key].strip(), (spec_id, key)
    entries = 0
    for section in ENTRY_SECTIONS:
        for key, entry in data.get(section, {}).items():
            where = f"{spec_id}: {section}.{key}"
            assert isinstance(entry.get("source"), str) and entry["source"].strip(), where
            assert isinstance(entry.get("uncertain"), bool), where
            if "note" in entry:
                assert isinstance(entry["note"], str) and entry["note"].strip(), where
            entries += 1
    assert entries and data.get("peaks") and "bandwidth" in data["dram"]


def test_the_catalog_has_at_least_30_chips_one_per_file():
    chips = catalog()
    assert len(chips) >= 30
    assert sorted(chips) == sorted(f.removesuffix(".toml") for f in FILES)


def test_every_chip_has_a_readme_row():
    with open(os.path.join(SPECS, "README.md"), encoding="utf-8") as f:
        rows = set(re.findall(r"^\| ([a-z0-9-]+) \|", f.read(), re.M))
    assert set(catalog()) <= rows, sorted(set(catalog()) - rows)


def test_on_chip_levels_include_one_facing_dram():
    # a report names the level that bounds DRAM traffic for any chip listing on-chip sizes
    for spec in catalog().values():
        if spec.onchip:
            assert spec.dram_cache() in spec.onchip, spec.id


def test_peaks_are_ordered_where_a_chip_lists_both():
    for spec in catalog().values():
        p = spec.at_clock("datasheet").peaks
        for a, b in (("tensor_fp16", "vector_fp16"), ("tensor_bf16", "vector_bf16"),
                     ("tensor_fp8", "tensor_bf16"), ("tensor_fp4", "tensor_fp8"),
                     ("tensor_bf16", "tensor_tf32")):
            if a in p and b in p:
                assert p[a] >= p[b], (spec.id, a, b)


# (chip, pipe, dense rate as printed, where the vendor prints it)
DATASHEET = [
    # NVIDIA L4 datasheet: FP16 Tensor Core 242 TFLOPS (with sparsity) -> 121 dense
    ("l4", "tensor_fp16", 121e12),
    # NVIDIA L4 datasheet: FP8 / INT8 Tensor Core 485 (with sparsity) -> 242.5 dense
    ("l4", "tensor_fp8", 242.5e12),
    # NVIDIA A10 datasheet: BFLOAT16 Tensor Core 125 TF | 250 TF with sparsity
    ("a10", "tensor_bf16", 125e12),
    # NVIDIA T4 datasheet: INT8 130 TOPS (Turing: no sparsity)
    ("t4", "tensor_int8", 130e12),
    # NVIDIA L40/L40S datasheet, L40 column: BFLOAT16 Tensor Core 181.05 | 362.1*
    ("l40", "tensor_bf16", 181.05e12),
    # NVIDIA H200 NVL: BFLOAT16 Tensor Core 1,671 TFLOPS (with sparsity) -> 835.5 dense
    ("h200-nvl", "tensor_bf16", 835.5e12),
    # AMD MI325X (= MI300X compute): BF16 matrix 1307.4 TFLOPS dense (2614.9 sparse)
    ("mi325x", "tensor_bf16", 1307.4e12),
    # Google Cloud TPU v6e docs: Peak compute per chip (Int8) 1836 TOPs
    ("tpu-v6e", "tensor_int8", 1836e12),
    # Google Cloud TPU7x docs: Peak compute per chip (FP8) 4614 TFLOPs
    ("tpu-v7", "tensor_fp8", 4614e12),
    # AWS Neuron docs, Trainium2: 1,299 FP8 TFLOPS, 667 BF16/FP16/TF32 TFLOPS
    ("trainium2", "tensor_fp8", 1299e12),
    ("trainium2", "tensor_bf16", 667e12),
    # Intel Gaudi 3 (Hot Chips 2024): BF16 Matrix TFLOPs 1835, BF16 Vector TFLOPs 28.7
    ("gaudi3", "tensor_bf16", 1835e12),
    ("gaudi3", "vector_bf16", 28.7e12),
]


@pytest.mark.parametrize("chip,pipe,rate", DATASHEET, ids=[f"{c}-{p}" for c, p, _ in DATASHEET])
def test_printed_rates_match_their_data_sheet(chip, pipe, rate):
    assert load_spec(f"{chip}@datasheet").peak(pipe) == pytest.approx(rate, rel=1e-12)


def test_memory_figures_match_their_data_sheet():
    # NVIDIA L4: 300 GB/s; AMD MI325X: 6 TB/s, 256 GB; TPU7x: 192 GiB; Apple M4 Max: 546GB/s
    assert load_spec("l4").bandwidth == 300e9
    assert load_spec("mi325x").bandwidth == 6.0e12
    assert load_spec("mi325x").onchip["llc"] == 256 * 2**20
    assert load_spec("tpu-v7").entries["dram.capacity"]["value"] == 192 * 2**30
    assert load_spec("m4-max").bandwidth == 546e9


def test_rates_stated_at_another_clock_scale_to_the_chip_clock():
    # H200 NVL: NVIDIA's dense tensor rates imply 1545 MHz; its SMs boost to 1785 MHz
    nvl = load_spec("h200-nvl")
    assert nvl.peak("tensor_bf16") == pytest.approx(835.5e12 * 1785 / 1545, rel=1e-12)
    assert nvl.peak("vector_fp32") == 60e12                  # stated at the chip clock
    # Gaudi 3: 1835 TFLOPS at the 1750 MHz spec clock is 1677.7 at the 1600 MHz that
    # devices report (stas00/ml-engineering: "its BF16 TFLOPS are 1677")
    g3 = load_spec("gaudi3@1600MHz").peak("tensor_bf16")
    assert g3 == pytest.approx(1835e12 * 1600 / 1750, rel=1e-12)
    assert round(g3 / 1e12) == 1678
