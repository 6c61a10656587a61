"""The access0 predictor: the documented algorithm, from our tables, for each shipped topology."""

import pytest
import dataclasses

import pytest

from pfcxl.device.fabric import constants as fc
from pfcxl.device.fabric import model as fabric_model
from pfcxl.device.facts import qemu as qemu_facts
from pfcxl.device import topology
from pfcxl.host_tools.vm import perf_predict as pp

pytestmark = pytest.mark.unit


def load(name, **changes):
    return dataclasses.replace(topology.load(topology.resolve(name)), **changes)


def test_link_terms_of_qemu_links():
    assert pp.LINK_LATENCY_PS == 17_000          # 68-byte flit at 32 GT/s per lane
    assert pp.LINK_RAW_MBS == 64_000 and pp.LINK_AVAILABLE_MBS == 63_014   # 16 x 31507 Mb/s / 8


def test_pf_nic_is_the_papers_decomposition_plus_one_link():
    (p,) = pp.predict(load("pf-nic"))
    link = 17
    assert p.read_latency == fc.PF_T_MEM_READ_NS + fc.PF_T_REQ_NS + fc.PF_T_RESP_NS + link   # 283 + 17
    assert p.write_latency == fc.PF_T_MEM_WRITE_NS + fc.PF_T_REQ_NS + fc.PF_T_RESP_NS + link  # 224 + 17
    assert (p.read_bandwidth, p.write_bandwidth) == (fc.PF_PORT_BANDWIDTH_MBS,) * 2
    assert p.link_hops == 1
    assert p.as_linux_6_12().as_sysfs() == {"read_latency": 17283, "write_latency": 17224,
                                            "read_bandwidth": 25600, "write_bandwidth": 25600}


def test_electrical_switch_adds_the_hop_and_shares_the_upstream_link():
    (p,) = pp.predict(load("electrical-switch"))
    assert p.read_latency == fabric_model.idle_ns("electrical", False) + 2 * 17
    assert p.link_hops == 2                                # root port and switch downstream port
    # 4 devices x 25.6 GB/s exceed the switch's 64 GB/s upstream link
    assert p.read_bandwidth == min(4 * fc.EL_MODULE.read_bandwidth_mbs, pp.LINK_RAW_MBS, fc.EL_SWITCH_BANDWIDTH_MBS)
    assert p.as_linux_6_12().read_latency == p.read_latency + 2 * (17_000 - 17)


def test_two_host_bridges_sum_their_bandwidth():
    (p,) = pp.predict(load("two-hb-interleave"))
    assert p.read_bandwidth == 2 * fc.PF_PORT_BANDWIDTH_MBS
    assert p.read_latency == 300


def test_without_timing_there_is_nothing_to_predict():
    assert pp.predict(load("pf-nic", timing=None)) == []


def test_switch_without_profile_figures_uses_qemus_default_sslbis():
    (p,) = pp.predict(load("electrical-switch", timing="pf"))
    assert p.read_latency == fc.PF_MODULE.read_latency_ns + qemu_facts.DEFAULT_SWITCH_CDAT.read_latency_ns + 71 + 34
    assert p.read_bandwidth == min(4 * min(fc.PF_PORT_BANDWIDTH_MBS, 16 * 1024), pp.LINK_RAW_MBS)


# What the kernels tried printed (docs/notes/kernel-matrix.md): pf-nic one link hop,
# electrical-switch two, as system-ram regions.
SEEN = {("pf-nic", "6.12.95+deb12-amd64"): (17283, 17224), ("pf-nic", "6.12.107+deb13-amd64"): (17283, 17224),
        ("pf-nic", "6.12.117+deb13-amd64"): (285, 226), ("electrical-switch", "6.12.107+deb13-amd64"): (34833, 34774),
        ("pf-nic", "7.3.4+deb13-amd64"): (285, 226),
        ("electrical-switch", "6.12.95+deb12-amd64"): (34833, 34774),
        ("electrical-switch", "7.3.4+deb13-amd64"): (837, 778)}


@pytest.mark.parametrize("name,release", sorted(SEEN))
def test_each_kernels_rule_gives_what_it_printed_and_is_named(name, release):
    (p,) = pp.predict(load(name))
    printed, rule = p.for_kernel(release)
    assert (printed.read_latency, printed.write_latency) == SEEN[name, release]
    assert printed.read_bandwidth == p.read_bandwidth        # bandwidth rules did not change
    assert rule == (pp.RULE_LINK_PS if release.startswith(("6.12.95", "6.12.107")) else pp.RULE_LINK_WHOLE_NS)


@pytest.mark.parametrize("release,rule", [("6.1.0-28-amd64", "ps"), ("6.12.9+deb12-amd64", "ps"),
                                          ("6.12.95+deb12-amd64", "ps"), ("6.12.107+deb13-amd64", "ps"),
                                          ("6.12.108", "ns"),
                                          ("6.12.117+deb13-amd64", "ns"), ("6.19.14+deb13-amd64", "ns"),
                                          ("7.0-rc2", "ns"), ("7.3.4+deb13-amd64", "ns")])
def test_the_rule_follows_the_release_by_version_number(release, rule):
    # numbers, not strings: "6.12.9" < "6.12.95" < "6.12.107"
    (p,) = pp.predict(load("pf-nic"))
    assert p.for_kernel(release)[1] == {"ps": pp.RULE_LINK_PS, "ns": pp.RULE_LINK_WHOLE_NS}[rule]
