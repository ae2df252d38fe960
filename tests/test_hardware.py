"""CPU model and instruction sets from /proc/cpuinfo text."""

from viasd_adapters.hardware import cpu_info, parse_cpuinfo

INTEL = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse2 avx avx2 avx512f avx512bw avx512_bf16 amx_bf16 amx_tile amx_int8
processor\t: 1
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse2 avx avx2 avx512f avx512bw avx512_bf16 amx_bf16 amx_tile amx_int8
"""
AMD = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7B13 64-Core Processor
flags\t\t: fpu sse2 avx avx2 fma
"""


def test_intel_amx_machine():
    info = cpu_info(INTEL, environ={})
    assert info.model == "Intel(R) Xeon(R) Platinum 8480+"
    assert info.isa == ("AMX-BF16", "AMX-INT8", "AVX512-BF16", "AVX-512", "AVX2")
    assert info.slug == "intel-r-xeon-r-platinum-8480-amx"
    assert info.label.startswith("Intel(R) Xeon(R) Platinum 8480+ (AMX-BF16, AMX-INT8")


def test_amd_avx2_machine():
    info = cpu_info(AMD, environ={})
    assert info.isa == ("AVX2",) and info.slug == "amd-epyc-7b13-64-core-processor-avx2"
    assert "(AVX2; " in info.label


def test_a_generic_virtual_cpu_name_gets_its_family_and_model():
    text = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\nmodel name\t: AMD EPYC\nflags\t\t: avx2 avx512f\n\nprocessor\t: 1\ncpu family\t: 99\n"
    info = cpu_info(text, environ={})
    assert info.model == "AMD EPYC (family 25, model 17)"  # Zen 4: the name alone does not tell
    assert info.slug == "amd-epyc-family-25-model-17-avx512"
    assert cpu_info(AMD, environ={}).model == "AMD EPYC 7B13 64-Core Processor"  # a named model stays as it is


def test_no_cpuinfo_still_names_something():
    assert parse_cpuinfo("") == (None, set())
    info = cpu_info("", environ={})
    assert info.model and info.isa == () and info.isa_label == "no AVX2" and info.logical_cores >= 1


def test_kernel_limits_are_named_and_keep_their_own_files():
    emulated = cpu_info(INTEL, environ={"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "PATH": "/bin"})
    assert emulated.limits == ("ATEN_CPU_CAPABILITY=avx2", "ONEDNN_MAX_CPU_ISA=AVX2")
    assert emulated.label.endswith("; kernels limited: ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2)")
    real, other = cpu_info(INTEL, environ={}), cpu_info(INTEL, environ={"ATEN_CPU_CAPABILITY": "avx2"})
    assert len({real.slug, emulated.slug, other.slug}) == 3 and emulated.slug.startswith(real.slug + "-limited-")
