"""pfcxl inject / Machine.inject: every kind becomes the QMP command QEMU 10 documents, with the
device named as in the topology; every bad argument is one line and builds no command."""

import pytest
from hypothesis import given, settings, strategies as st

from pfcxl.device import topology
from pfcxl.errors import PfcxlError
from pfcxl.host_tools.vm import inject

TOPO = topology.load(topology.resolve("two-hb-interleave"))
DEV = TOPO.devices[0]
SIZE = DEV.capacity

pytestmark = pytest.mark.unit


def test_every_kind_names_its_qmp_command_and_device_path():
    for kind, (command, _) in inject.KINDS.items():
        for dev in TOPO.devices:
            done = inject.plan(TOPO, kind, dev.id)
            assert done.command == command and done.serial == dev.serial
            assert done.arguments["path"] == f"/machine/peripheral/{dev.id}"


def test_fields_given_are_the_fields_sent():
    gm = inject.plan(TOPO, "general-media", DEV.id, dpa=0x4000, log="failure", type=0x10, descriptor=2,
                     transaction_type=3, flags=1)
    assert gm.arguments == {"path": f"/machine/peripheral/{DEV.id}", "log": "failure", "flags": 1, "dpa": 0x4000,
                            "descriptor": 2, "type": 0x10, "transaction-type": 3}
    mm = inject.plan(TOPO, "memory-module", DEV.id, temperature=77, life_used=9)
    assert mm.arguments["temperature"] == 77 and mm.arguments["life-used"] == 9 and "dpa" not in mm.arguments
    assert inject.plan(TOPO, "uncorrectable", DEV.id, type="mem-data-ecc").arguments["errors"][0]["type"] == "mem-data-ecc"
    assert inject.plan(TOPO, "correctable", DEV.id, type="crc-threshold").arguments["type"] == "crc-threshold"


@settings(max_examples=300, deadline=None)
@given(start=st.integers(0, SIZE // 64 - 1), lines=st.integers(1, 64))
def test_poison_inside_the_device_is_sent_as_given(start, lines):
    start, length = start * 64, lines * 64
    if start + length > SIZE:
        with pytest.raises(PfcxlError, match="ends past device"):
            inject.plan(TOPO, "poison", DEV.id, dpa=start, length=length)
    else:
        assert inject.plan(TOPO, "poison", DEV.id, dpa=start, length=length).arguments == {
            "path": f"/machine/peripheral/{DEV.id}", "start": start, "length": length}


@settings(max_examples=300, deadline=None)
@given(dpa=st.integers(0, 2**64 - 1), length=st.integers(1, 2**20), kind=st.sampled_from(["poison", "general-media", "dram"]))
def test_a_bad_dpa_or_length_is_one_line(dpa, length, kind):
    extra = {"length": length} if kind == "poison" else {}
    ok = dpa < SIZE and dpa % 64 == 0 and (kind != "poison" or (length % 64 == 0 and dpa + length <= SIZE))
    if ok:
        inject.plan(TOPO, kind, DEV.id, dpa=dpa, **extra)
        return
    with pytest.raises(PfcxlError) as caught:
        inject.plan(TOPO, kind, DEV.id, dpa=dpa, **extra)
    message = str(caught.value)
    assert "\n" not in message
    assert any(why in message for why in ("is outside device", "is not a multiple of 64", "ends past device"))


@pytest.mark.parametrize("kind,device,fields,why", [
    ("poison", "nosuch", {}, "has no device 'nosuch'"),
    ("meltdown", DEV.id, {}, "kind 'meltdown' is not one of"),
    ("dram", DEV.id, {"log": "loud"}, "log 'loud' is not one of"),
    ("general-media", DEV.id, {"type": 256}, "type 0x100 is outside"),
    ("correctable", DEV.id, {"type": "internal"}, "type 'internal' is not one of"),
    ("poison", DEV.id, {"dpa": "0x40"}, "dpa must be a whole number"),
    ("memory-module", DEV.id, {"dpa": 64}, "memory-module takes no dpa"),
    ("correctable", DEV.id, {"length": 64}, "correctable takes no length"),
])
def test_bad_arguments_are_one_line(kind, device, fields, why):
    with pytest.raises(PfcxlError, match="^inject: [^\n]*$") as caught:
        inject.plan(TOPO, kind, device, **fields)
    assert why in str(caught.value)


# Trace lines as the guest's Linux 6.12 printed them for injections into pf-nic's device (serial 1346764801)
TRACE = """# tracer: nop
 irq/27-0000:0d:-103     [000] .....    36.115512: cxl_general_media: memdev=mem0 host=0000:0d:00.0 serial=1346764801 log=Informational : time=1 uuid=u len=128 flags='0x1' handle=1 related_handle=0 maint_op_class=0 : dpa=2000 dpa_flags='' descriptor='UNCORRECTABLE_EVENT|THRESHOLD_EVENT' type='0x10' transaction_type='Host Read' channel=0 rank=0 device=0 hpa=250002000 region=region0
 irq/29-0000:0d:-105     [000] .....    36.143502: cxl_dram: memdev=mem0 host=0000:0d:00.0 serial=1346764801 log=Failure : time=1 uuid=u len=128 flags='0x1' handle=1 related_handle=0 maint_op_class=0 : dpa=3000 dpa_flags='' descriptor='UNCORRECTABLE_EVENT' type='Scrub Media ECC Error' transaction_type='Host Write' channel=0
 irq/28-0000:0d:-104     [000] .....    36.164863: cxl_memory_module: memdev=mem0 host=0000:0d:00.0 serial=1346764801 log=Warning : time=1 uuid=u len=128 flags='0x1' handle=1 : event_type='Media Status Change' life_used=4 device_temp=5 dirty_shutdown_cnt=6
   irq/24-aerdrv-49      [000] .....    38.489762: cxl_aer_correctable_error: memdev=mem0 host=0000:0d:00.0 serial=1346764801: status: 'Memory Data ECC Error'
   irq/24-aerdrv-49      [000] .....    42.513577: cxl_aer_uncorrectable_error: memdev=mem0 host=0000:0d:00.0 serial=1346764801: status: 'Component Specific Error' first_error: 'Component Specific Error'
"""


class _Done:
    def __init__(self, output):
        self.output, self.status = output, 0


def test_the_guests_trace_lines_are_found_for_the_device_and_matched_to_what_was_injected():
    import pfcxl.device.topology as t
    pfnic = t.load(t.resolve("pf-nic"))
    dev = pfnic.devices[0].id
    run = lambda command: _Done(TRACE)    # noqa: E731
    cases = [("general-media", {"dpa": 0x2000, "type": 0x10}, {"dpa": 0x2040}),
             ("dram", {"dpa": 0x3000, "log": "failure"}, {"dpa": 0x3000, "log": "warning"}),
             ("memory-module", {"log": "warning", "life_used": 4, "temperature": 5}, {"life_used": 5, "log": "warning"}),
             # RAS errors: the status names pinned in AER_STATUS; a type without one takes any new record
             ("correctable", {"type": "mem-data-ecc"}, None),
             ("uncorrectable", {"type": "internal"}, None)]
    for kind, injected, other in cases:
        injection = inject.plan(pfnic, kind, dev, **injected)
        [line] = inject._records(run, injection)
        assert f" {injection.trace_event}: " in line
        assert inject.guest_record(run, injection, 0, timeout=0) == [line]
        if other is not None:
            assert not inject.matches(inject.plan(pfnic, kind, dev, **other), line), (kind, other)
    wrong_serial = TRACE.replace("serial=1346764801", "serial=99")
    injection = inject.plan(pfnic, "dram", dev, dpa=0x3000, log="failure")
    assert inject._records(lambda command: _Done(wrong_serial), injection) == []


@pytest.mark.parametrize("argv, why", [
    (["--dpa", "0", "--set", "dpa=64"], "--set dpa=64 and --dpa 0 both set the field dpa: give it once"),
    (["--set", "length=64", "--length", "128"], "--set length=64 and --length 128 both set the field length: give it once"),
    (["--set", "dpa=0", "--set", "dpa=64"], "--set dpa=0 and --set dpa=64 both set the field dpa: give it once"),
])
def test_a_field_given_twice_is_refused_before_anything_is_sent(argv, why, capsys, monkeypatch):
    from pfcxl.host_tools.cli import main as cli
    from pfcxl.host_tools.fleet import detached
    monkeypatch.setattr(detached, "call", lambda *a, **k: pytest.fail("the injection was sent"))
    assert cli.main(["inject", "poison", "--name", "nosuch", "-d", "pfnic0", *argv]) == 1
    assert capsys.readouterr().err.strip() == f"pfcxl: error: {why}"
