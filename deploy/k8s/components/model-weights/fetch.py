# The weights Job (components/model-weights): downloads MODEL_REPO at MODEL_REVISION into
# MODEL_DIR on the shared volume, then writes the completion marker naming that model and
# revision; the engines and the layer wait for the marker naming theirs. Run as
# `python3 -c "$(FETCH_SCRIPT)"` from the ConfigMap model-fetch, whose content hash names
# the Job: a changed script, model or image makes a new Job, never an immutable-field error.
import os
import pathlib
import sys

repo, rev = os.environ["MODEL_REPO"], os.environ["MODEL_REVISION"]
key = f"{repo}@{rev}"
target = pathlib.Path(os.environ["MODEL_DIR"])
done = target / ".loopstack-complete"
if done.is_file() and done.read_text().strip() == key:
    print(f"{target}: {key} already complete")
    raise SystemExit(0)

# Write where this uid can, whatever the volume's type (kubelet applies no fsGroup to most
# NFS volumes): the first folder that exists on the way to MODEL_DIR must be writable.
mount = target
while not mount.exists() and mount != mount.parent:
    mount = mount.parent
if not os.access(mount, os.W_OK | os.X_OK):
    st = mount.stat()
    sys.exit(
        f"{mount} is not writable by uid {os.getuid()} (owner uid {st.st_uid}, gid "
        f"{st.st_gid}, mode {st.st_mode & 0o7777:o}): a root-owned export. Let the storage "
        "class make the volume writable (csi-driver-nfs: mountPermissions \"0777\"; EFS: an "
        "access point with uid/gid 10001), or make the folder once as root: "
        "docs/deploy.md, 'Storage for the weights'"
    )
target.mkdir(parents=True, exist_ok=True)
done.unlink(missing_ok=True)  # another model or revision was here: not complete for this one

from huggingface_hub import snapshot_download  # noqa: E402 - after the checks, which need none

patterns = ["*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken", "*.jinja"]
if os.environ.get("FETCH_TOKENIZER_ONLY") == "1":  # the layer: tokenizer and configs only
    patterns.remove("*.safetensors")
snapshot_download(repo, revision=rev, local_dir=target, allow_patterns=patterns)
done.write_text(key + "\n")
print(f"{target}: {key} complete")
