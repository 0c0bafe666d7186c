"""The first run's notice: the compiled kernels' cache found cold or warm."""
from netdef.layers import jit


def test_a_cold_cache_gets_a_notice_naming_where_the_kernels_go(tmp_path):
    notice = jit.compile_notice([str(tmp_path)])
    assert notice is not None and "Compiling netdef's CPU kernels for this machine" in notice
    assert str(tmp_path) in notice and jit.COMPILE_TIME in notice


def test_a_cached_kernel_of_this_package_makes_it_warm(tmp_path):
    (tmp_path / "unrelated.f-3.py311.nbi").write_bytes(b"")
    assert jit.cache_is_cold([str(tmp_path)])
    nested = tmp_path / "site-packages_netdef_layers_jit"  # numba's layout under NUMBA_CACHE_DIR
    nested.mkdir()
    (nested / "pooling.max_pool-40.py311.nbi").write_bytes(b"")
    assert not jit.cache_is_cold([str(tmp_path)])
    assert jit.compile_notice([str(tmp_path)]) is None
