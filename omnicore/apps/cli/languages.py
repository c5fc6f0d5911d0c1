"""`omnicore languages`: the languages the model knows, as `id<TAB>name` lines by name; with
--search, those whose id or name contains the text (any case)."""

from __future__ import annotations


def cmd_languages(args) -> int:
    from ...text import frontend

    found = frontend.search_languages(args.search)
    for lang_id, name in found:
        print(f"{lang_id}\t{name}")
    return 0 if found else 1


def add_parser(sub) -> None:
    sp = sub.add_parser("languages", help="list the languages --language takes",
                        description="List the languages the model knows: an id and its English "
                                    "name per line (--language takes either). Exits 1 when "
                                    "--search finds none.")
    sp.add_argument("--search", metavar="TEXT", help="only those whose id or name contains TEXT")
    sp.set_defaults(func=cmd_languages)
