// Shared by hub.cpp (cache lookup) and hub_download.cpp (filling the cache). Not for other users.
#pragma once
#include <string>

#include "io/hub.h"

namespace anatomy::hub_detail {

// "`huggingface-cli download NAME [--revision R]`": the command that fetches a model for us.
std::string fetch_command(const std::string& repo, const std::string& revision);
bool is_commit_hash(const std::string& s);
// "" when the revision names no commit in the cache yet.
std::string cached_commit(const std::string& repo_dir, const std::string& revision);
// What a snapshot lacks for anatomy, "" when it is usable. Throws for sharded-only weights.
std::string snapshot_missing(const std::string& repo, const std::string& snapshot_dir);
// Downloads what anatomy needs of `repo` at `revision` into the cache; returns the snapshot dir.
std::string download(const HubSettings& s, const std::string& repo, const std::string& revision);

}  // namespace anatomy::hub_detail
