"""onnxruntime's execution-provider device API: get_ep_devices, OrtEpDevice, OrtHardwareDevice,
the selection policy of SessionOptions.set_provider_selection_policy (or its delegate), and
the provider assignment InferenceSession.get_provider_graph_assignment_info reports
(OrtEpAssignedSubgraph, OrtEpAssignedNode).

onnxpy lists one device per provider it can run here: the CPU always, and each CUDA device when
its CUDA provider is available. A session whose options name devices (add_provider_for_devices)
or a policy, and that is given no ``providers``, runs on the provider they select. Memory infos
and sync streams of a device are not supported (onnxpy has no native allocators).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

from . import unsupported
from .enums import NamedIntEnum


class OrtHardwareDeviceType(NamedIntEnum):
    CPU = 0
    GPU = 1
    NPU = 2


class OrtExecutionProviderDevicePolicy(NamedIntEnum):
    DEFAULT = 0
    PREFER_CPU = 1
    PREFER_NPU = 2
    PREFER_GPU = 3
    MAX_PERFORMANCE = 4
    MAX_EFFICIENCY = 5
    MIN_OVERALL_POWER = 6


class OrtDeviceVendorId(enum.IntEnum):
    """PCI vendor ids, for OrtDevice.make's vendor_id (a plain IntEnum, as onnxruntime's)."""

    NONE = 0
    AMD = 0x1002
    NVIDIA = 0x10DE
    ARM = 0x13B5
    MICROSOFT = 0x1414
    HUAWEI = 0x19E5
    QUALCOMM = 0x5143
    INTEL = 0x8086


# Policies that ask for the fastest device: the GPU when there is one. The others (power,
# efficiency, an NPU onnxpy does not have) fall back to the CPU, as onnxruntime's do without one.
_GPU_POLICIES = frozenset(
    {OrtExecutionProviderDevicePolicy.PREFER_GPU, OrtExecutionProviderDevicePolicy.MAX_PERFORMANCE}
)

#: PCI vendor ids, as onnxruntime reports them
_CPU_VENDORS = {"GenuineIntel": ("Intel", 0x8086), "AuthenticAMD": ("AMD", 0x1022)}  # AMD's CPUs: 0x1022
_NVIDIA = ("NVIDIA", int(OrtDeviceVendorId.NVIDIA))


class OrtHardwareDevice:
    """A piece of hardware: its type, vendor (name and PCI id), device id and metadata."""

    def __init__(self, type: OrtHardwareDeviceType, vendor: str, vendor_id: int, device_id: int) -> None:  # noqa: A002
        self._type, self._vendor, self._vendor_id, self._device_id = type, vendor, vendor_id, device_id

    @property
    def type(self) -> OrtHardwareDeviceType:
        return self._type

    @property
    def vendor(self) -> str:
        return self._vendor

    @property
    def vendor_id(self) -> int:
        return self._vendor_id

    @property
    def device_id(self) -> int:
        return self._device_id

    @property
    def metadata(self) -> dict[str, str]:
        return {}

    def __repr__(self) -> str:
        return f"<OrtHardwareDevice {self._type.name} vendor={self._vendor!r} device_id={self._device_id}>"


class OrtEpDevice:
    """A device an execution provider can run on, with the provider options that select it."""

    def __init__(self, ep_name: str, device: OrtHardwareDevice, ep_options: dict[str, str]) -> None:
        self._ep_name, self._device, self._ep_options = ep_name, device, dict(ep_options)

    @property
    def ep_name(self) -> str:
        return self._ep_name

    @property
    def ep_vendor(self) -> str:
        return "onnxpy"  # who implements the provider here (onnxruntime says "Microsoft")

    @property
    def ep_metadata(self) -> dict[str, str]:
        from .. import __version__

        return {"version": __version__}

    @property
    def ep_options(self) -> dict[str, str]:
        return dict(self._ep_options)

    @property
    def device(self) -> OrtHardwareDevice:
        return self._device

    def memory_info(self, memory_type: Any) -> Any:
        unsupported.refuse("OrtEpDevice.memory_info", unsupported.ALLOCATOR)

    def create_sync_stream(self) -> Any:
        unsupported.refuse("OrtEpDevice.create_sync_stream", unsupported.ALLOCATOR)

    def __repr__(self) -> str:
        return f"<OrtEpDevice {self._ep_name} on {self._device!r}>"


def _cpu_vendor() -> tuple[str, int]:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return _CPU_VENDORS.get(line.split(":", 1)[1].strip(), ("", 0))
    except OSError:  # not Linux: the vendor is unknown, as the device still is usable
        pass
    return "", 0


def _cuda_count() -> int:
    from ..providers import cuda_available

    if not cuda_available():
        return 0
    import cupy  # noqa: PLC0415 - optional dependency, present when CUDA is available

    return int(cupy.cuda.runtime.getDeviceCount())


def get_ep_devices() -> list[OrtEpDevice]:
    """The devices onnxpy's providers can run on here: each CUDA device (when the CUDA provider
    is available), then the CPU."""
    devices = [
        OrtEpDevice(
            "CUDAExecutionProvider", OrtHardwareDevice(OrtHardwareDeviceType.GPU, *_NVIDIA, 0), {"device_id": str(i)}
        )
        for i in range(_cuda_count())
    ]
    cpu = OrtHardwareDevice(OrtHardwareDeviceType.CPU, *_cpu_vendor(), 0)
    devices.append(OrtEpDevice("CPUExecutionProvider", cpu, {}))
    return devices


def providers_for_devices(devices: list[OrtEpDevice], options: dict[str, str]) -> tuple[str, dict[str, str]]:
    """The (provider, options) that runs on ``devices`` (all of one provider; the first one's
    device is used: an onnxpy session runs on one device)."""
    return devices[0].ep_name, {**devices[0].ep_options, **options}


def device_of_provider(ep_name: str, device_type: str, device_id: int) -> OrtEpDevice:
    """The OrtEpDevice a provider of a session runs on (a provider registered with
    onnxpy.providers.register_provider, which get_ep_devices does not list, gets its own)."""
    for d in get_ep_devices():
        if d.ep_name == ep_name and d.ep_options.get("device_id", "0") == str(device_id):
            return d
    kind = OrtHardwareDeviceType.CPU if device_type == "cpu" else OrtHardwareDeviceType.GPU
    return OrtEpDevice(ep_name, OrtHardwareDevice(kind, "", 0, device_id), {"device_id": str(device_id)})


#: what a selection delegate is told it may return at most (onnxruntime's limit)
MAX_SELECTIONS = 8


def providers_for_delegate(delegate: Callable[..., Any], model_metadata: dict[str, str]) -> list[Any]:
    """The (provider, options) pairs the devices ``delegate`` selects run on, in its order.
    Errors as onnxruntime reports them: Fail for a delegate that raises, returns something else
    than OrtEpDevices or selects nothing; InvalidArgument for two devices of one provider (an
    onnxpy session runs on one device)."""
    from .errors import Fail, InvalidArgument

    available = get_ep_devices()
    try:
        chosen = delegate(available, dict(model_metadata), {}, MAX_SELECTIONS)
        if isinstance(chosen, (str, bytes, dict)) or not hasattr(chosen, "__iter__"):
            raise TypeError(f"expected a list of OrtEpDevice, got {type(chosen).__name__}")
        chosen = list(chosen)
        for d in chosen:
            if not isinstance(d, OrtEpDevice):
                raise TypeError(f"expected a list of OrtEpDevice, got an element of type {type(d).__name__}")
    except Exception as e:  # noqa: BLE001 - the user's code: reported as onnxruntime reports it
        raise Fail(f"EP selection delegate failed: {type(e).__name__}: {e}") from e
    if not chosen:
        raise Fail("EP selection delegate did not select anything.")
    if len(chosen) > MAX_SELECTIONS:
        raise InvalidArgument(
            f"EP selection delegate selected {len(chosen)} devices; at most {MAX_SELECTIONS} may be selected"
        )
    pairs: list[Any] = []
    for d in chosen:
        if any(name == d.ep_name for name, _ in pairs):
            raise InvalidArgument(
                f"EP selection delegate selected more than one device of {d.ep_name}: an onnxpy session runs "
                "on one device of each provider"
            )
        pairs.append((d.ep_name, d.ep_options))
    return pairs


class OrtEpAssignedNode:
    """A node of the session's graph, as InferenceSession.get_provider_graph_assignment_info
    reports it: name, domain and op type."""

    def __init__(self, name: str, domain: str, op_type: str) -> None:
        self._name, self._domain, self._op_type = name, domain, op_type

    @property
    def name(self) -> str:
        return self._name

    @property
    def domain(self) -> str:
        return self._domain

    @property
    def op_type(self) -> str:
        return self._op_type

    def __repr__(self) -> str:
        return f"<OrtEpAssignedNode name={self._name!r} domain={self._domain!r} op_type={self._op_type!r}>"


class OrtEpAssignedSubgraph:
    """Nodes a provider runs (get_provider_graph_assignment_info)."""

    def __init__(self, ep_name: str, nodes: list[OrtEpAssignedNode]) -> None:
        self._ep_name, self._nodes = ep_name, list(nodes)

    @property
    def ep_name(self) -> str:
        return self._ep_name

    def get_nodes(self) -> list[OrtEpAssignedNode]:
        return list(self._nodes)

    def __repr__(self) -> str:
        return f"<OrtEpAssignedSubgraph {self._ep_name} nodes={self._nodes!r}>"


def providers_for_policy(policy: OrtExecutionProviderDevicePolicy) -> list[str]:
    if policy in _GPU_POLICIES and _cuda_count():
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]
