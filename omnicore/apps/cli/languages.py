"""`omnicore languages`: the languages the model knows, as `id<TAB>name` lines by name; with
--search, those whose id or name contains the text (any case). A search that finds none says so
in one line on stderr and exits 1, as grep does: a script can tell "none" from a match, and
neither is a failure of the command (2)."""

from __future__ import annotations

from . import common


def cmd_languages(args) -> int:
    from ...text import frontend

    found = frontend.search_languages(args.search)
    for lang_id, name in found:
        print(f"{lang_id}\t{name}")
    if not found:  # the answer, not a summary: said with -q too
        common.error_line(f"omnicore: no language matches {args.search!r} (no id or name contains "
                         f"it{frontend.language_hint(args.search)}); `omnicore languages` lists "
                         "them all")
        return 1
    return 0


def add_parser(sub) -> None:
    sp = sub.add_parser("languages", help="list the languages --language takes",
                        description="List the languages the model knows: an id and its English "
                                    "name per line (--language takes either). Every OmniVoice "
                                    "checkpoint knows the same ones: --model is taken, as by "
                                    "every command, and not loaded. When --search finds none, "
                                    "one line on stderr says so and the exit status is 1 (as "
                                    "grep's).")
    sp.add_argument("--search", metavar="TEXT", help="only those whose id or name contains TEXT")
    common.add_model_options(sp)
    sp.set_defaults(func=cmd_languages)
