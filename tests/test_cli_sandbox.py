"""The cli sandbox (r1/envs/sandbox.py, r1/envs/shell_commands.py): hostile commands are refused or confined, and the commands work.

A canary file and folder sit next to the sandbox root. After every command
the canary's bytes, mtime and atime (set older than its mtime, so a read
updates it under relatime), the outside folder's listing and times, and a
snapshot of the whole sandbox tree must be unchanged, and the canary's
content must not appear in any output. Planted in the tree: symlinks to the
canary (absolute and relative), to the outside folder, a chain that leaves
in its second hop, a loop, a hard link to the canary, a fifo, a binary file, a non-UTF-8 name, a 3 MB
file, a file with one long line and a folder of 1,500 files.
"""
import os
import stat

import pytest

from r1.envs.sandbox import MAX_ARGS, MAX_COMMAND, Sandbox
from r1.envs.tools import get_tool

CANARY = "CANARY-7f3a-do-not-read"
OLD_ATIME, OLD_MTIME = 1_000_000_000, 1_500_000_000


def _snapshot(path) -> dict:
    """Every entry below path (bytes names): (mode, size, mtime_ns, link target)."""
    out = {}
    for base, dirs, files in os.walk(os.fsencode(path)):
        for name in dirs + files:
            p = os.path.join(base, name)
            st = os.lstat(p)
            out[p] = (st.st_mode, st.st_size, st.st_mtime_ns, os.readlink(p) if stat.S_ISLNK(st.st_mode) else None)
    return out


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    base = tmp_path_factory.mktemp("cli")
    outside = base / "outside"
    outside.mkdir()
    canary = base / "canary.txt"
    canary.write_text(CANARY + "\n")
    (outside / "canary.txt").write_text(CANARY + " inside outside\n")
    root = base / "root"
    (root / "docs" / "sub").mkdir(parents=True)
    (root / "logs").mkdir()
    (root / "many").mkdir()
    (root / "a.txt").write_text("alpha\nbeta\ngamma\nalpha\n")
    (root / "docs" / "notes.md").write_text("# Notes\nbuy milk\ncall Bob\n")
    (root / "docs" / "sub" / "deep.txt").write_text("deep word\n")
    (root / "docs" / ".hidden").write_text("hidden\n")
    (root / "logs" / "app.log").write_text("1 INFO ok\n2 ERROR disk full\n3 WARN slow\n4 ERROR again\n")
    (root / "logs" / "big.log").write_text("x" * 50 + "\n" * 1)
    (root / "bin.dat").write_bytes(b"\x00\x01\x02\xff\xfe alpha \x1b[31m red \x00" * 10)
    (root / "big.txt").write_text(("line of text alpha\n") * 150_000)  # 2.85 MB
    (root / "long.txt").write_text("a" * 20_000 + "\n")
    (root / "doc.pdf").write_bytes(b"%PDF-1.4\n% alpha\n%%EOF\n")
    for i in range(1500):
        (root / "many" / f"f{i:04d}.txt").write_text(f"{i}\n")
    with open(os.path.join(os.fsencode(root), b"caf\xe9.txt"), "wb") as f:
        f.write(b"non utf8 name\n")
    os.symlink(str(canary), root / "link_abs")
    os.symlink("../canary.txt", root / "link_rel")
    os.symlink("../outside", root / "link_out")
    os.symlink("../link_rel", root / "docs" / "link_chain")
    os.symlink("loop", root / "loop")
    os.symlink("a.txt", root / "link_in")
    os.symlink(str(root / "docs"), root / "link_abs_in")
    os.mkfifo(root / "fifo")
    os.link(canary, root / "hard")  # same inode as the canary
    for p in (canary, outside / "canary.txt", outside):
        os.utime(p, (OLD_ATIME, OLD_MTIME))
    return {"base": base, "root": root, "canary": canary, "outside": outside, "sb": Sandbox(root),
            "snapshot": _snapshot(root), "base_names": sorted(os.listdir(base))}


def _check_untouched(world):
    for p in (world["canary"], world["outside"] / "canary.txt", world["outside"]):
        st = os.stat(p)
        assert (int(st.st_atime), int(st.st_mtime)) == (OLD_ATIME, OLD_MTIME), f"{p} was read or changed"
    assert world["canary"].read_text() == CANARY + "\n"
    os.utime(world["canary"], (OLD_ATIME, OLD_MTIME))  # read_text above touched it under relatime
    assert sorted(os.listdir(world["outside"])) == ["canary.txt"]
    os.utime(world["outside"], (OLD_ATIME, OLD_MTIME))
    assert sorted(os.listdir(world["base"])) == world["base_names"]
    assert _snapshot(world["root"]) == world["snapshot"], "the sandbox tree changed"


def run(world, command):
    result = world["sb"].run(command)
    assert isinstance(result.text, str) and isinstance(result.ok, bool)
    result.text.encode("utf-8")  # no lone surrogates: the tokenizer must be able to encode any output
    assert not any(ord(c) < 32 and c not in "\n\t" for c in result.text), "control characters in the output"
    assert CANARY not in result.text
    assert len(result.text) <= world["sb"].max_output + 200
    _check_untouched(world)
    return result


def test_atime_detects_a_read(world):
    """The canary check can fail: a plain read of the canary (its atime older than its mtime, so relatime
    updates it) is caught by the check every command runs."""
    canary = world["canary"]
    try:
        canary.read_text()
        if int(os.stat(canary).st_atime) == OLD_ATIME:
            pytest.skip("this filesystem does not update atime (noatime); the content and snapshot checks remain")
        with pytest.raises(AssertionError, match="was read or changed"):
            _check_untouched(world)
    finally:
        os.utime(canary, (OLD_ATIME, OLD_MTIME))


REFUSED = {
    # deletion, writing, other programs
    "rm": "rm -rf .", "rm_canary": "rm ../canary.txt", "rmdir": "rmdir docs", "unlink": "unlink a.txt",
    "mv": "mv a.txt b.txt", "cp": "cp a.txt b.txt", "touch": "touch new", "mkdir": "mkdir new",
    "chmod": "chmod 777 a.txt", "ln": "ln -s / root", "dd": "dd if=/dev/zero of=a.txt", "tee": "tee a.txt",
    "truncate": "truncate -s 0 a.txt", "sed_i": "sed -i d a.txt", "awk": "awk '{print}' a.txt",
    "sh": "sh -c 'cat ../canary.txt'", "bash": "bash -c ls", "python": "python3 -c 'print(1)'",
    "perl": "perl -e 1", "env": "env", "sudo": "sudo ls", "xargs": "xargs rm", "exec": "exec ls", "eval": "eval ls",
    "source": "source x", "dot": ". x", "abs_binary": "/bin/cat a.txt", "rel_binary": "./a.txt",
    "curl": "curl http://example.com", "wget": "wget http://example.com", "nc": "nc -l 8080",
    "ssh": "ssh host", "git": "git status", "unknown": "frobnicate",
    "find_exec": "find . -exec cat {} \\;", "find_exec_plus": "find . -exec cat {} +",
    "find_execdir": "find . -execdir ls \\;", "find_ok": "find . -ok rm {} \\;", "find_delete": "find . -delete",
    "find_name_delete": "find . -name a.txt -delete", "find_fprint": "find . -fprint out.txt",
    # redirection
    "redirect_out": "ls > out.txt", "redirect_append": "ls >> a.txt", "redirect_echo": "echo hi > a.txt",
    "redirect_in": "cat < ../canary.txt", "redirect_fd": "ls 2>&1", "redirect_all": "ls &> out",
    "clobber": "cat a.txt >| a.txt", "heredoc": "cat <<EOF", "process_sub": "cat <(ls)",
    "devnull": "grep x a.txt 1>/dev/null",
    # command substitution and expansion
    "subst": "echo $(cat ../canary.txt)", "backticks": "echo `cat ../canary.txt`",
    "subst_in_quotes": 'echo "$(id)"', "backticks_in_quotes": 'ls "`id`"', "subst_arg": "cat $(echo a.txt)",
    "env_home": "echo $HOME", "env_braces": "echo ${PATH}", "env_pwd": "cat $PWD/../canary.txt",
    "env_quoted": 'echo "$USER"', "env_special": "echo $$", "env_zero": "echo $0", "assign": "A=1 ls",
    "export": "export X=1", "printenv": "printenv",
    # chains
    "semicolon": "ls; cat ../canary.txt", "and": "ls && rm a.txt", "or": "ls || rm a.txt",
    "pipe_sh": "ls | sh", "pipe_xargs": "ls | xargs rm", "pipe_python": "cat a.txt | python3",
    "pipe_bash_c": "ls | bash -c 'cat ../canary.txt'", "background": "ls & rm a.txt", "newline": "ls\nrm a.txt",
    "escaped_newline": "ls \\\ncat ../canary.txt", "carriage": "ls\rrm a.txt", "pipe_amp": "ls |& cat",
    "empty_stage": "ls | | wc", "trailing_pipe": "ls |", "subshell": "(cat ../canary.txt)",
    "group": "{ ls; }", "brace": "cat {a,b}.txt", "brace_range": "ls f{1..3}", "comment": "ls # comment",
    "too_many_stages": "ls | sort | sort | sort | sort",
    # leaving the root
    "dotdot": "cat ../canary.txt", "ls_dotdot": "ls ..", "dotdot_deep": "ls docs/../..",
    "dotdot_mid": "cat docs/../../canary.txt", "find_dotdot": "find .. -name canary.txt",
    "du_dotdot": "du -sb ..", "wc_dotdot": "wc -c ../canary.txt", "head_dotdot": "head ../canary.txt",
    "tail_dotdot": "tail ../canary.txt", "file_dotdot": "file ../canary.txt", "sort_dotdot": "sort ../canary.txt",
    "uniq_dotdot": "uniq ../canary.txt", "grep_dotdot": "grep -r CANARY ..", "virtual_dotdot": "ls /sandbox/..",
    "virtual_dotdot_file": "cat /sandbox/../canary.txt", "dotdot_outside": "cat ../outside/canary.txt",
    # absolute paths
    "etc_passwd": "cat /etc/passwd", "ls_root": "ls /", "ls_tmp": "ls /tmp", "find_root": "find / -name passwd",
    "grep_root": "grep -r root /", "grep_etc": "grep -r root /etc", "double_slash": "cat //etc/passwd",
    "proc_environ": "cat /proc/self/environ", "proc_cwd": "ls /proc/self/cwd/..", "dev_zero": "cat /dev/zero",
    "dev_urandom": "head -c 10 /dev/urandom", "sandboxx": "ls /sandboxx",
    # home
    "tilde": "ls ~", "tilde_file": "cat ~/.bashrc", "tilde_user": "ls ~root", "cd_home": "cd ~", "cd": "cd docs",
    # globbing out of the root
    "glob_up": "cat ../*", "glob_root": "cat /*", "glob_etc": "ls /etc/*", "glob_up_mid": "cat */../../*",
    "glob_canary": "cat ../c*", "glob_up_up": "ls ../../*", "glob_link_out": "cat link_out/*",
    "glob_qmark_up": "cat ../canary.tx?", "glob_class_up": "cat ../[c]anary.txt",
    # symlinks planted in the tree
    "link_abs": "cat link_abs", "link_rel": "cat link_rel", "link_out": "ls link_out",
    "link_out_file": "cat link_out/canary.txt", "link_out_grep": "grep -r CANARY link_out",
    "link_out_find": "find link_out", "link_out_du": "du link_out", "link_chain": "cat docs/link_chain",
    "link_wc": "wc -c link_abs", "link_head": "head link_rel", "link_sort": "sort link_abs",
    "link_grep": "grep CANARY link_abs", "link_tail": "tail -n 1 docs/link_chain",
    "link_in_glob": "ls docs/*", "link_ls_chain": "ls docs/link_chain",
    # not regular files
    "fifo_cat": "cat fifo", "fifo_grep": "grep x fifo", "fifo_wc": "wc fifo", "fifo_head": "head fifo",
    # sizes
    "huge_args": "ls " + "a.txt " * (MAX_ARGS + 10), "too_long": "ls " + "a" * MAX_COMMAND,
    "glob_too_many": "ls many/*", "nul": "ls \x00", "escape_char": "ls \x1b[31m",
    "lone_surrogate": "cat \ud800", "escaped_byte_name": "cat caf\udce9.txt",
}


@pytest.mark.parametrize("command", list(REFUSED.values()), ids=list(REFUSED))
def test_refused(world, command):
    result = run(world, command)
    assert not result.ok
    assert result.refused, result.text
    assert result.text.startswith("refused: ") and "\n" not in result.text and len(result.text) < 300


FAILS = {  # not unsafe, but failing: ok=False with a message, nothing read outside
    "loop": "cat loop", "missing": "cat nope.txt", "dir": "cat docs", "bad_flag": "ls -Z",
    "find_L": "find -L .", "find_or": "find . -name a -o -name b", "binary_cat": "cat bin.dat",
    "redos_nested": "grep -E '(a+)+$' long.txt", "redos_alternation": "grep -E '(a|aa)*b' long.txt",
    "redos_bre": "grep '\\(a*\\)*b' long.txt", "backref": "grep '\\(a\\)\\1' a.txt",
    "redos_budget": "grep '.*.*.*.*z' long.txt", "hard_link_cat": "cat hard", "hard_link_wc": "wc -c hard",
    "hard_link_grep_r": "grep -r CANARY .", "grep_dir": "grep alpha docs", "no_input": "wc",
    "head_bad_number": "head -n x a.txt", "grep_no_pattern": "grep",
}


@pytest.mark.parametrize("command", list(FAILS.values()), ids=list(FAILS))
def test_fails_cleanly(world, command):
    result = run(world, command)
    assert not result.ok and not result.refused, result.text
    assert result.text.strip()


CONFINED = {  # allowed, but what they show stays inside root
    "grep_r": "grep -r CANARY docs", "grep_R": "grep -R CANARY logs", "grep_r_none": "grep -rl CANARY many",
    "find_all": "find . -type f -name '*canary*'", "ls_hard": "ls -l hard", "ls_R": "ls -R docs", "du": "du -sb .",
    "ls_l_links": "ls -l", "file_links": "file link_abs link_out fifo loop", "find_links": "find . -type l",
    "glob_star_dirs": "ls */", "cat_many": "cat " + "a.txt " * 300,
}


@pytest.mark.parametrize("command", list(CONFINED.values()), ids=list(CONFINED))
def test_confined(world, command):
    result = run(world, command)
    assert result.ok, result.text
    assert "outside" not in result.text or "link_out" in result.text


def test_symlinks_are_not_followed_by_recursive_commands(world):
    out = run(world, "find . -name canary.txt").text
    assert out == "(no output)"
    assert run(world, "du -b link_out").refused
    du = run(world, "du -sb .").text
    total = int(du.split()[0])
    real = sum(os.lstat(os.path.join(b, f)).st_size for b, _, fs in os.walk(world["root"]) for f in fs
               if stat.S_ISREG(os.lstat(os.path.join(b, f)).st_mode))
    assert total == real


def test_symlinks_inside_root_work(world):
    assert run(world, "cat link_in").text == "alpha\nbeta\ngamma\nalpha"
    assert run(world, "ls link_abs_in").text == "link_chain\nnotes.md\nsub"


def test_long_outputs_are_capped(world):
    r = run(world, "cat big.txt")
    assert r.ok and "[output truncated:" in r.text
    assert run(world, "wc -l big.txt").text == "150000 big.txt"
    r = run(world, "cat big.txt | sort | uniq -c")
    assert r.ok and r.text == " 150000 line of text alpha"
    r = run(world, "cat big.txt big.txt big.txt big.txt")  # 11 MB through a pipe-less cat: capped as output
    assert "truncated" in r.text or not r.ok
    r = run(world, "cat big.txt big.txt | wc -l")  # over the 4M characters allowed between stages
    assert not r.ok and "narrow it down" in r.text
    r = run(world, "find many")
    assert r.ok and "truncated" in r.text


def test_binary_and_non_utf8(world):
    assert "binary file" in run(world, "cat bin.dat").text
    assert run(world, "grep alpha bin.dat").text == "Binary file bin.dat matches"
    assert run(world, "file bin.dat doc.pdf a.txt").text == "bin.dat: data\ndoc.pdf: PDF document\na.txt: ASCII text"
    assert "caf\\xe9.txt" in run(world, "ls").text
    r = run(world, "cat caf*")  # the glob matches the undecodable name, which is read inside root
    assert r.ok and r.text == "non utf8 name"
    assert run(world, "head -c 40 bin.dat").ok  # bytes decoded with replacement, controls shown as '?'
    assert run(world, "find . -name 'caf*'").text == "./caf\\xe9.txt"


def test_shell_tool_unbound_and_non_string(world):
    assert not get_tool("shell")({"command": "ls"}).ok
    assert run(world, "   ").refused
    assert world["sb"].run(123).refused


# ---------------------------------------------------------------- what the commands do


@pytest.mark.parametrize("command,expected", [
    ("pwd", "/sandbox"),
    ("echo hello  world", "hello world"),
    ("ls docs", "link_chain\nnotes.md\nsub"),
    ("ls -a docs", ".hidden\nlink_chain\nnotes.md\nsub"),
    ("ls /sandbox/docs/sub", "deep.txt"),
    ("ls -S logs", "app.log\nbig.log"),
    ("ls -Sr logs", "big.log\napp.log"),
    ("ls docs/notes.md a.txt", "a.txt\ndocs/notes.md"),
    ("ls -R docs", "docs:\nlink_chain\nnotes.md\nsub\n\ndocs/sub:\ndeep.txt"),
    ("find docs", "docs\ndocs/.hidden\ndocs/link_chain\ndocs/notes.md\ndocs/sub\ndocs/sub/deep.txt"),
    ("find docs/ -type f -name '*.txt'", "docs/sub/deep.txt"),
    ("find . -maxdepth 1 -name '*.txt'", "./a.txt\n./big.txt\n./caf\\xe9.txt\n./long.txt"),
    ("find docs -type d", "docs\ndocs/sub"),
    ("find docs -mindepth 1 -maxdepth 1 -not -name '.*' -not -type l", "docs/notes.md\ndocs/sub"),
    ("find logs -size +1k", "(no output)"),
    ("find logs -size +52c -type f", "logs/app.log"),
    ("find logs -size -52c -type f", "logs/big.log"),
    ("find . -iname 'DOC.PDF'", "./doc.pdf"),
    ("find docs -path '*sub*' -type f", "docs/sub/deep.txt"),
    ("find docs/.hidden -empty", "(no output)"),
    ("grep alpha a.txt", "alpha\nalpha"),
    ("grep -c alpha a.txt", "2"),
    ("grep -n ERROR logs/app.log", "2:2 ERROR disk full\n4:4 ERROR again"),
    ("grep -v -e alpha -e beta a.txt", "gamma"),
    ("grep -i BOB docs/notes.md", "call Bob"),
    ("grep -w alph a.txt", "(no output)"),
    ("grep -x beta a.txt", "beta"),
    ("grep -E 'ERROR|WARN' logs/app.log", "2 ERROR disk full\n3 WARN slow\n4 ERROR again"),
    ("grep 'ERROR\\|WARN' logs/app.log", "2 ERROR disk full\n3 WARN slow\n4 ERROR again"),
    ("grep -o '[0-9] [A-Z]*' logs/app.log", "1 INFO\n2 ERROR\n3 WARN\n4 ERROR"),
    ("grep -F '.' a.txt", "(no output)"),
    ("grep 'a.p' a.txt", "alpha\nalpha"),
    ("grep -c '^[[:alpha:]]*$' a.txt", "4"),
    ("grep -rl word docs", "docs/sub/deep.txt"),
    ("grep -r --exclude=hard word", "docs/sub/deep.txt:deep word"),
    ("grep -r --include='*.md' Bob .", "./docs/notes.md:call Bob"),
    ("grep -rc ERROR logs", "logs/app.log:2\nlogs/big.log:0"),
    ("grep -L ERROR logs/app.log logs/big.log", "logs/big.log"),
    ("grep -m 1 alpha a.txt", "alpha"),
    ("wc -l a.txt", "4 a.txt"),
    ("wc a.txt", " 4  4 23 a.txt"),
    ("wc -l a.txt docs/notes.md", "4 a.txt\n3 docs/notes.md\n7 total"),
    ("cat a.txt | wc -l", "4"),
    ("head -n 2 a.txt", "alpha\nbeta"),
    ("head -1 a.txt", "alpha"),
    ("tail -n 1 a.txt", "alpha"),
    ("tail -n +3 a.txt", "gamma\nalpha"),
    ("head -c 3 a.txt", "alp"),
    ("head -n 1 a.txt docs/notes.md", "==> a.txt <==\nalpha\n\n==> docs/notes.md <==\n# Notes"),
    ("cat -n docs/notes.md", "     1\t# Notes\n     2\tbuy milk\n     3\tcall Bob"),
    ("sort a.txt", "alpha\nalpha\nbeta\ngamma"),
    ("sort -u a.txt", "alpha\nbeta\ngamma"),
    ("sort -r a.txt | head -n 1", "gamma"),
    ("sort a.txt | uniq -c", "      2 alpha\n      1 beta\n      1 gamma"),
    ("sort a.txt | uniq -d", "alpha"),
    ("sort a.txt | uniq -u", "beta\ngamma"),
    ("sort -n -k 1 logs/app.log | tail -n 1", "4 ERROR again"),
    ("sort -t ' ' -k 2,2 -r logs/app.log | head -n 1", "3 WARN slow"),
    ("wc -l a.txt logs/app.log | sort -n", "4 a.txt\n4 logs/app.log\n8 total"),
    ("du -sb logs", "105\tlogs"),
    ("du -b -a logs", "54\tlogs/app.log\n51\tlogs/big.log\n105\tlogs"),
    ("du -s logs", "1\tlogs"),
    ("file docs logs/app.log", "docs: directory\nlogs/app.log: ASCII text"),
    ("ls -l logs/app.log", None),
    ("ls *.txt", "a.txt\nbig.txt\ncaf\\xe9.txt\nlong.txt"),
    ("ls 'a*'", None),
    ("ls nomatch*", None),
    ("ls docs/n* docs/s*", "docs/notes.md\n\ndocs/sub:\ndeep.txt"),
    ("ls -d */", "docs/\nlink_abs_in/\nlogs/\nmany/"),
    ("cat d?cs/s[u]b/deep.txt", "deep word"),
])
def test_commands(world, command, expected):
    result = run(world, command)
    if command == "ls -l logs/app.log":
        assert result.ok and result.text.startswith("-rw") and " 54 " in result.text and "logs/app.log" in result.text
        return
    if command in ("ls 'a*'", "ls nomatch*"):  # quoted: literal; no match: the word stays as written
        assert not result.ok and "cannot access" in result.text and "*" in result.text
        return
    assert result.ok, result.text
    assert result.text == expected


def test_missing_file_is_an_error_with_partial_output(world):
    r = run(world, "cat a.txt nope.txt")
    assert not r.ok and r.text.startswith("alpha") and "nope.txt: No such file or directory" in r.text


def test_output_cap_is_a_parameter(world):
    sb = Sandbox(world["root"], max_output=50)
    r = sb.run("cat big.txt")
    assert r.text.startswith("line of text alpha\n") and r.text.endswith("e.g. | head]") and len(r.text) < 200
    _check_untouched(world)


def test_os_errors_are_results(world, monkeypatch):
    """A folder the process may not read (root reads them all, so the error is simulated) is an ok=False
    result naming no real path, not an exception."""
    import r1.envs.sandbox as cli

    def denied(path):
        raise PermissionError(13, "Permission denied", str(path))
    monkeypatch.setattr(cli.os, "scandir", denied)
    r = world["sb"].run("ls docs")
    assert not r.ok and r.text == "error: Permission denied"


def test_root_must_be_a_directory(world):
    with pytest.raises(ValueError, match="not a directory"):
        Sandbox(world["root"] / "a.txt")
