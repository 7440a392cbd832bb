"""The GPU catalogue against the memory drivers report (nvidia-smi MiB, rocm-smi bytes) and datasheets."""

import pytest
from conftest import GiB, MiB

from kvplan import gpus
from kvplan.errors import KvplanError


@pytest.mark.parametrize(("name", "mib"), [
    ("h100", 81_559),  # nvidia-smi: NVIDIA H100 80GB HBM3, 81559MiB
    ("h200", 143_771),  # NVIDIA H200, 143771MiB
    ("h100-nvl", 95_830),
    ("h20", 97_871),
    ("b200", 183_359),
    ("a100-80gb", 81_920),
    ("a100-40gb", 40_960),
    ("l4", 23_034),
    ("l40s", 46_068),
    ("a10g", 23_028),
    ("t4", 15_360),
    ("rtx-4090", 24_564),
    ("rtx-3090", 24_576),
    ("rtx-5090", 32_607),
    ("b300", 275_040),  # NVIDIA B300 SXM6 AC, 275040 MiB
    ("gb200", 189_471),  # NVIDIA GB200, 189471 MiB
    ("gb300", 284_208),  # NVIDIA GB300, 284208 MiB
])
def test_memory_as_the_driver_reports_it(name, mib):
    assert gpus.find(name).memory_bytes == mib * MiB


def test_mi300x_reports_192_gib():
    # rocm-smi --showmeminfo vram: VRAM Total Memory (B): 206158430208
    assert gpus.find("mi300x").memory_bytes == 206_158_430_208 == 192 * GiB


def test_apple_unified_memory_usable_fraction():
    # Metal's recommendedMaxWorkingSetSize on a 64 GB Mac: 51,539.61 MB = 48 GiB = 3/4 of 64 GiB
    m1 = gpus.find("m1-max")
    assert m1.memory_bytes == 64 * GiB
    assert m1.usable_bytes == 51_539_607_552


# Metal's recommendedMaxWorkingSetSize as llama.cpp logged it, by unified memory: "MB" is 10**6 bytes in its logs
# since 2024 and 2**20 bytes ("MiB") before; each value printed with two decimals.
LOGGED_WORKING_SET = [
    ("m1-pro-16gb", 11_453.25, 10**6),  # Apple M1 Pro 16 GB: 11453.25 MB (2/3)
    ("m4-pro-24gb", 17_179.89, 10**6),  # Apple M2 24 GB: 17179.89 MB (2/3)
    ("m2-max-32gb", 21_845.34, 2**20),  # M2 Max 32 GB: 21845.34 MiB (ollama issue #434; 2/3)
    ("m4-max-36gb", 28_991.03, 10**6),  # Apple M4 Max 36 GB: 28991.03 MB (3/4)
    ("m3-max-48gb", 38_654.71, 10**6),  # Apple M3 Max 48 GB: 38654.71 MB (3/4)
    ("m1-max-64gb", 49_152.00, 2**20),  # M1 Max 64 GB: 49152.00 MiB (llama.cpp issue #1870; 3/4)
    ("m2-max-96gb", 73_728.00, 2**20),  # M2 Max 96 GB: 73728.00 MiB (llama.cpp issue #3213; 3/4)
]


@pytest.mark.parametrize(("name", "logged", "unit"), LOGGED_WORKING_SET)
def test_apple_usable_memory_is_metals_working_set(name, logged, unit):
    """2/3 of RAM up to 32 GB, 3/4 from 36 GB, in whole 16 KiB pages; the 24 GB log is one page above 2/3."""
    gpu = gpus.find(name)
    assert gpu.vendor == "apple"
    assert abs(gpu.usable_bytes - logged * unit) <= 16 * 1024 + 0.005 * unit


def test_every_apple_part_is_a_whole_rule():
    for gpu in gpus.catalogue():
        if gpu.vendor == "apple":
            share = 2 / 3 if gpu.memory_bytes <= 32 * GiB else 0.75
            assert gpu.usable_fraction == pytest.approx(share) and gpu.memory_bytes % GiB == 0, gpu.name


def test_mi355x_reports_288_gib():
    # vLLM on MI355X: --gpu-memory-utilization 0.95 requests 273.6 GiB, 0.85 244.8 GiB (0.95 x 288, 0.85 x 288)
    mi355x = gpus.find("mi355x")
    assert mi355x.memory_bytes == 288 * GiB and mi355x.vendor == "amd"
    assert round(0.95 * mi355x.memory_bytes / GiB, 1) == 273.6 and round(0.85 * mi355x.memory_bytes / GiB, 1) == 244.8


def test_vendor_of_names():
    assert (gpus.vendor("h100"), gpus.vendor("MI300X"), gpus.vendor("m3 ultra"), gpus.vendor("tpu")) == (
        "nvidia", "amd", "apple", None)


@pytest.mark.parametrize("alias", ["h100", "H100-80GB", "H100 80GB", "h100_sxm", "NVIDIA H100 80GB HBM3"])
def test_aliases(alias):
    assert gpus.find(alias).name == "NVIDIA H100 SXM"


def test_the_issue_list_is_covered():
    wanted = ["h100", "h100-pcie", "h100-nvl", "h200", "h20", "b200", "a100-40gb", "a100-80gb", "a10g",
              "a10", "l4", "l40s", "v100", "t4", "rtx-3090", "rtx-4090", "rtx-5090", "rtx-6000-ada",
              "mi300x", "mi325x", "mi355x", "m2-ultra", "m1-max", "m1-ultra", "m2-max", "m3-max", "m3-ultra",
              "m4-max", "m3-pro", "m4-pro"]
    for name in wanted:
        gpus.find(name)


def test_every_entry_has_a_source_and_bandwidth():
    for gpu in gpus.catalogue():
        assert gpu.source and gpu.reported and gpu.bandwidth_gbs > 0
        assert gpu.bf16_tflops or gpu.note  # no BF16 figure only with a note saying why


@pytest.mark.parametrize(("name", "capability"), [
    # NVIDIA's table of CUDA compute capabilities (developer.nvidia.com/cuda-gpus)
    ("h100", (9, 0)), ("h100-pcie", (9, 0)), ("h200", (9, 0)), ("h20", (9, 0)), ("b200", (10, 0)),
    ("gb200", (10, 0)), ("b300", (10, 3)), ("gb300", (10, 3)),
    ("rtx-5090", (12, 0)), ("a100-80gb", (8, 0)), ("a10g", (8, 6)), ("l40s", (8, 9)), ("rtx-4090", (8, 9)),
    ("v100", (7, 0)), ("t4", (7, 5)), ("mi300x", None), ("m3-ultra", None), ("tpu", None),
])
def test_compute_capability(name, capability):
    assert gpus.compute_capability(name) == capability


def test_only_nvidia_entries_give_a_compute_capability():
    for gpu in gpus.catalogue():
        assert (gpu.compute_capability is not None) == (gpu.vendor == "nvidia"), gpu.name
    entry = gpus.catalogue()[0].model_dump()
    with pytest.raises(ValueError, match="compute_capability"):
        gpus.Gpu(**{**entry, "compute_capability": None})
    with pytest.raises(ValueError, match="compute_capability"):
        gpus.Gpu(**{**entry, "compute_capability": "9"})


def test_dense_bf16_from_datasheets():
    # H100 SXM datasheet: 1,979 TFLOP/s BF16 with sparsity -> 989.4 dense; A100: 312; L4: 242 sparse -> 121
    assert gpus.find("h100").bf16_tflops == 989.4
    assert gpus.find("a100-80gb").bf16_tflops == 312
    assert gpus.find("l4").bf16_tflops == 121


def test_unknown_gpu_names_the_closest():
    with pytest.raises(KvplanError, match="closest: NVIDIA A100 40GB SXM, NVIDIA A100 80GB SXM"):
        gpus.find("a100")
    with pytest.raises(KvplanError, match="H100"):
        gpus.find("h1000")


def test_catalogue_ships_inside_the_package():
    assert gpus.CATALOGUE.parent.parent.name == "kvplan"


# Dense tensor throughput per GPU, TFLOP/s (BF16, FP8, FP4), from NVIDIA's datasheets: most state it with 2:4
# sparsity, which doubles the dense figure; the system datasheets state it for the whole board or rack.
DENSE = {
    "h100": (1979 / 2, 3958 / 2, None),  # H100 SXM5: 1,979 and 3,958 with sparsity
    "h200": (1979 / 2, 3958 / 2, None),
    "h100-pcie": (1513 / 2, 3026 / 2, None),
    "b200": (36_000 / 2 / 8, 72_000 / 2 / 8, 72_000 / 8),  # HGX B200: 36 PF BF16, 72 PF FP8 sparse; 72 PF FP4 dense
    "b300": (36_000 / 2 / 8, 72_000 / 2 / 8, 108_000 / 8),  # HGX B300: 108 PF FP4 dense
    "gb200": (5000 / 2, 10_000 / 2, 20_000 / 2),  # GB200 NVL72, a GPU: 5, 10, 20 PF with sparsity
    "gb300": (180_000 / 72, 360_000 / 72, 1_080_000 / 72),  # GB300 NVL72: 180, 360, 1,080 PF dense for 72 GPUs
}


@pytest.mark.parametrize(("name", "figures"), sorted(DENSE.items()))
def test_dense_tensor_throughput_by_dtype(name, figures):
    gpu = gpus.find(name)
    for given, published in zip((gpu.bf16_tflops, gpu.fp8_tflops, gpu.fp4_tflops), figures, strict=True):
        assert given == (published and pytest.approx(published, rel=1e-3))  # 1,979 is 1,978.9 rounded


def test_nvlink_per_gpu_and_domain():
    # NVLink 4 (Hopper): 900 GB/s a GPU, 8 on an HGX board; NVLink 5 (Blackwell): 1.8 TB/s, 8 on HGX, 72 in NVL72
    assert [(gpus.find(n).nvlink_gbs, gpus.find(n).nvlink_gpus) for n in ("h100", "h200", "b200", "b300", "gb200",
                                                                            "gb300")] == [
        (900, 8), (900, 8), (1800, 8), (1800, 8), (1800, 72), (1800, 72)]
    assert gpus.find("l40s").nvlink_gbs is None and gpus.find("h100-pcie").nvlink_gpus == 2


def test_every_hopper_and_blackwell_part_has_its_low_precision_rates():
    """FP8 tensor cores from Hopper (9.0) on, FP4 from Blackwell (10.x); each rate above the wider one's."""
    for gpu in gpus.catalogue():
        major = gpus.compute_capability(gpu.name)
        if major and major[0] in (9, 10):
            assert gpu.fp8_tflops and gpu.fp8_tflops > gpu.bf16_tflops, gpu.name
            assert (gpu.fp4_tflops is not None) == (major[0] == 10), gpu.name
            assert gpu.fp4_tflops is None or gpu.fp4_tflops > gpu.fp8_tflops, gpu.name


def test_grace_blackwell_entries_are_one_gpu_of_a_superchip():
    for name in ("gb200", "gb300"):
        gpu = gpus.find(name)
        assert "per GPU, not per superchip" in gpu.source and gpu.memory_bytes < 300 * GiB
