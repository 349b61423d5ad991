from dualloop.controller.bench.sim import bench_sim


def test_bench_reports_our_rate_and_highway_env_status() -> None:
    result = bench_sim(seconds=0.2, batch=4)
    assert result.ours_steps_per_s > 200.0  # i.e. faster than real time at 200 Hz
    assert result.ours_batch_episode_steps_per_s > result.ours_steps_per_s
    if result.highway_env_steps_per_s is None:
        assert "not importable" in result.highway_env_note
    else:
        assert result.ratio_single == result.ours_steps_per_s / result.highway_env_steps_per_s
