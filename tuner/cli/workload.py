"""`tuner workload ...`: fit profiles to traces, summarize traces, inspect and export profiles."""

from __future__ import annotations

from pathlib import Path

import click

from tuner.cli._common import emit_json, json_option

_FORMAT_HELP = "Trace format (auto-detected from the extension and content when omitted)."


def _format_option(f):
    from tuner.workload.importers import FORMATS

    return click.option("--format", "fmt", type=click.Choice(FORMATS), default=None, help=_FORMAT_HELP)(f)


_skip_bad_option = click.option("--skip-bad", is_flag=True, help="Skip malformed records (counted) instead of failing.")


@click.group()
def workload():
    """Fit, import and inspect workloads."""


@workload.command()
@click.argument("file", type=click.Path(path_type=Path))
@_format_option
@_skip_bad_option
@json_option
def stats(file, fmt, skip_bad, as_json):
    """Summarize a request trace: lengths, sessions, prefix reuse."""
    from tuner.workload.importers import load_trace
    from tuner.workload.trace import trace_stats

    doc = trace_stats(load_trace(file, fmt, skip_bad=skip_bad))
    if as_json:
        emit_json(doc)
        return
    click.echo(f"{doc['source']} ({doc['format']})")
    click.echo(f"  requests {doc['requests']:,}   sessions {doc['sessions']:,}   skipped lines {doc['skipped_lines']}")
    for key in ("input_tokens", "output_tokens"):
        s = doc[key]
        click.echo(f"  {key:<14} mean {s['mean']:>10,.0f}  median {s['median']:>10,.0f}  p90 {s['p90']:>10,.0f}  p99 {s['p99']:>10,.0f}")
    t = doc["turns_per_session"]
    click.echo(f"  turns/session  mean {t['mean']:>10,.1f}  median {t['median']:>10,.0f}  max {t['max']:>10,.0f}")
    ratio = doc["prefix_reuse_ratio"]
    click.echo(f"  prefix reuse   {'n/a' if ratio is None else f'{ratio:.1%}'} ({doc['prefix_reuse_method']})")
    for note in doc["notes"]:
        click.echo(f"  note: {note}")


@workload.command()
@click.argument("file", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Write the fitted profile here (YAML).")
@click.option("--name", default=None, help="Profile name (default: the output file's stem, else 'fitted').")
@_format_option
@click.option("--system-prefix-tokens", type=click.IntRange(min=0), default=None,
              help="Shared system + tool prompt length (default: what the trace reports, else 0).")
@click.option("--max-context-tokens", type=click.IntRange(min=1), default=None,
              help="Session-ending context limit (default: chosen to match the per-turn input distribution).")
@click.option("--include-subagents", is_flag=True, help="Fit sub-agent sessions (main.saN) too.")
@click.option("--seed", default=0, show_default=True, help="Seed of the model sample in the report.")
@_skip_bad_option
@json_option
def fit(file, output, name, fmt, system_prefix_tokens, max_context_tokens, include_subagents, seed, skip_bad, as_json):
    """Fit lognormal session parameters to a trace and report how well they match."""
    from tuner import safewrite
    from tuner.workload.fit import fit_trace
    from tuner.workload.importers import load_trace
    from tuner.workload.profiles import dump_profile, profile_name

    if output:
        output = safewrite.check_target(output)  # a bad path is refused before the trace is read
    name = profile_name(name, output)
    trace = load_trace(file, fmt, skip_bad=skip_bad)
    profile, report = fit_trace(trace, name=name, system_prefix_tokens=system_prefix_tokens,
                                max_context_tokens=max_context_tokens, include_subagents=include_subagents, seed=seed)
    if output:
        opts = "".join(f" {flag} {val}" for flag, val in (
            ("--format", fmt), ("--system-prefix-tokens", system_prefix_tokens),
            ("--max-context-tokens", max_context_tokens)) if val is not None)
        opts += " --include-subagents" if include_subagents else ""
        header = [f"Fitted by `tuner workload fit {file}{opts}` ({trace.format}, {report['sessions']} sessions).",
                  "KS statistic per fit (0 = identical distributions):"]
        header += [f"  {k}: {v['ks_statistic'] if v['ks_statistic'] is None else round(v['ks_statistic'], 3)}"
                   for k, v in report["fits"].items()]
        safewrite.write_text(output, dump_profile(profile, "\n".join(header)))
        report["output"] = str(output)
    report["profile"] = profile.model_dump()
    if as_json:
        emit_json(report)
        return
    click.echo(f"{report['source']} ({report['format']}): {report['sessions']} sessions, {report['requests']} requests, "
               f"system prefix {report['system_prefix_tokens']} tokens")
    click.echo(f"  {'quantity':<26} {'mu':>8} {'sigma':>7} {'median':>10} {'n':>7} {'excl':>6} {'KS':>6}")
    for key, f in report["fits"].items():
        ks = "-" if f["ks_statistic"] is None else f"{f['ks_statistic']:.3f}"
        click.echo(f"  {key:<26} {f['mu']:>8.3f} {f['sigma']:>7.3f} {f['median']:>10,.1f} {f['n']:>7} {f['excluded']:>6} {ks:>6}")
    cmp_ = report["input_tokens_per_turn"]
    click.echo(f"  input tokens per turn (max_context_tokens {cmp_['max_context_tokens']:,}; KS {cmp_['ks_statistic']:.3f}):")
    for q in ("p10", "p50", "p90", "p99", "mean"):
        click.echo(f"    {q:<5} data {cmp_['data'][q]:>12,.0f}   model {cmp_['model'][q]:>12,.0f}")
    click.echo(f"  context resets left out: {report['context_resets']}, shrinking turns left out: {report['shrinking_turns']}")
    if output:
        click.echo(f"wrote {output}")


@workload.command("list")
@json_option
def list_(as_json):
    """List the workload profiles found (workloads/ and built-in)."""
    from tuner.workload.profiles import available_profiles, load_profile, resolve_profile_path

    rows = []
    for name in available_profiles():
        path = resolve_profile_path(name)
        rows.append({"name": name, "path": str(path), "description": load_profile(path).description})
    if as_json:
        emit_json(rows)
        return
    for r in rows:
        click.echo(f"{r['name']:<16} {r['description']}  ({r['path']})")


@workload.command()
@click.argument("profile")
@click.option("--sessions", default=1000, show_default=True, help="Sessions drawn to summarize the profile.")
@click.option("--seed", default=0, show_default=True)
@json_option
def show(profile, sessions, seed, as_json):
    """Show a profile and the prompt lengths it produces."""
    import numpy as np

    from tuner.workload.fit import model_input_tokens
    from tuner.workload.profiles import load_profile
    from tuner.workload.session import generate_sessions

    prof = load_profile(profile)
    inputs = np.asarray(model_input_tokens(prof, sessions, seed), dtype=float)
    ss = generate_sessions(prof, sessions, seed)
    doc = {
        "profile": prof.model_dump(),
        "sample": {
            "sessions": sessions,
            "turns_per_session_mean": float(np.mean([s.num_turns for s in ss])),
            "input_tokens": {f"p{q}": float(np.percentile(inputs, q)) for q in (10, 50, 90, 99)},
            "output_tokens_mean": float(np.mean([t.output_tokens for s in ss for t in s.turns])),
            "final_context_tokens_p90": float(np.percentile([s.prompt_tokens(s.num_turns - 1) for s in ss], 90)),
        },
    }
    if as_json:
        emit_json(doc)
        return
    from tuner.workload.profiles import dump_profile

    click.echo(dump_profile(prof).rstrip())
    s = doc["sample"]
    click.echo(f"# sample of {sessions} sessions: {s['turns_per_session_mean']:.1f} turns, input per turn "
               + ", ".join(f"{k} {v:,.0f}" for k, v in s["input_tokens"].items())
               + f"; output mean {s['output_tokens_mean']:.0f}; final context p90 {s['final_context_tokens_p90']:,.0f}")


@workload.command()
@click.argument("profile")
@click.option("-o", "--output", type=click.Path(dir_okay=False), required=True, help="JSONL session log to write.")
@click.option("--sessions", default=100, show_default=True)
@click.option("--seed", default=0, show_default=True)
def export(profile, output, sessions, seed):
    """Write the sessions a profile generates as a JSONL session log (the `jsonl` trace format)."""
    from tuner.workload.profiles import load_profile
    from tuner.workload.sessionlog import write_session_log

    n = write_session_log(load_profile(profile), output, sessions=sessions, seed=seed)
    click.echo(f"wrote {n} requests of {sessions} sessions to {output}")


@workload.command("compare-windows")
@click.argument("a_file", metavar="A", type=click.Path(path_type=Path))
@click.argument("b_file", metavar="B", type=click.Path(path_type=Path))
@click.option("--aa", "same", nargs=2, multiple=True, type=click.Path(path_type=Path), metavar="X Y",
              help="Two windows of ONE configuration on two servers (an A/A pair, e.g. the default "
                   "variant of two calls): their difference beyond their own noise is the "
                   "between-servers spread, folded into every interval. Repeatable.")
@click.option("--resamples", type=click.IntRange(200, 20000), default=2000, show_default=True,
              help="Session bootstrap resamples per window.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the bootstrap.")
@json_option
def compare_windows_cmd(a_file, b_file, same, resamples, seed, as_json):
    """Is window B faster than window A beyond the noise? (an A/B of two servers)

    A and B are the request files of two load points at the same user count and seeds
    (loadpoint-NN-Uu.requests.jsonl.gz beside a trial's logs, e.g. the default and tuned
    variants of `tuner study tiles-ab`). For P50/P90 TPOT and TTFT it prints B/A with a 90%
    interval from a bootstrap over whole sessions, and for the requests present in both windows
    the median per-request TPOT ratio. A verdict is "faster" or "slower" only where the whole
    interval is below or above 1.

    A window's interval holds only its own sampling noise; two servers of one configuration differ
    by more (another process, another machine). Give A/A pairs with --aa to fold that in.
    """
    from tuner.workload.ab import LEVEL, compare_windows, read_requests, server_spread

    kwargs = {"seed": seed, "resamples": resamples}
    spread = server_spread([compare_windows(read_requests(x), read_requests(y), **kwargs) for x, y in same])
    result = compare_windows(read_requests(a_file), read_requests(b_file), server_sd=spread, **kwargs)
    if as_json:
        emit_json({"a": str(a_file), "b": str(b_file), "level": LEVEL, "aa_pairs": len(same),
                   "server_sd": spread, **result.to_dict()})
        return
    click.echo(f"B/A  (A: {a_file}, B: {b_file}); {LEVEL:.0%} intervals, session bootstrap"
               + (f", between-servers spread from {len(same)} A/A pair(s)" if same else
                  ", window noise only (no --aa)"))
    click.echo(f"  {'statistic':<12} {'B/A':>7}  {'interval':<17} {'requests A/B':>13}  verdict")
    for r in result.intervals:
        click.echo(f"  {r.metric:<12} {r.ratio:>7.3f}  [{r.low:.3f}, {r.high:.3f}]  "
                   f"{r.samples[0]:>6}/{r.samples[1]:<6}  {r.verdict.value}"
                   + (f"  (server sd {r.server_sd:.1%})" if r.server_sd else ""))
    if result.paired_tpot is None:
        click.echo("  (no paired TPOT: fewer than 10 requests of the same session and turn in both)")
