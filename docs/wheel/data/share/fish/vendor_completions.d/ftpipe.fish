# Print an optspec for argparse to handle cmd's options that are independent of any subcommand.
function __fish_ftpipe_global_optspecs
    string join \n h/help V/version
end

function __fish_ftpipe_needs_command
    # Figure out if the current invocation already has a command.
    set -l cmd (commandline -opc)
    set -e cmd[1]
    argparse -s (__fish_ftpipe_global_optspecs) -- $cmd 2>/dev/null
    or return
    if set -q argv[1]
        # Also print the command, so this can be used to figure out what it is.
        echo $argv[1]
        return 1
    end
    return 0
end

function __fish_ftpipe_using_subcommand
    set -l cmd (__fish_ftpipe_needs_command)
    test -z "$cmd"
    and return 1
    contains -- $cmd[1] $argv
end

complete -c ftpipe -n "__fish_ftpipe_needs_command" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c ftpipe -n "__fish_ftpipe_needs_command" -s V -l version -d 'Print version'
complete -c ftpipe -n "__fish_ftpipe_needs_command" -f -a "fetch" -d 'Download a pinned repo into DIR/source with strict Range resume'
complete -c ftpipe -n "__fish_ftpipe_needs_command" -f -a "status" -d 'Show the pin, stage states and byte counts of DIR'
complete -c ftpipe -n "__fish_ftpipe_needs_command" -f -a "audit" -d 'Reconcile the byte ledger against receipts and files on disk'
complete -c ftpipe -n "__fish_ftpipe_needs_command" -f -a "plan" -d 'Predict every output component\'s exact size before converting'
complete -c ftpipe -n "__fish_ftpipe_needs_command" -f -a "convert" -d 'Convert DIR/source into the artifact in DIR/artifact (resumable)'
complete -c ftpipe -n "__fish_ftpipe_needs_command" -f -a "run" -d 'resolve → plan → fetch → convert → verify, each a durable stage'
complete -c ftpipe -n "__fish_ftpipe_needs_command" -f -a "publish" -d 'Upload DIR\'s verified artifact to s3://BUCKET/PREFIX: components (resumable multipart uploads), each checked, then manifest.json, create-only'
complete -c ftpipe -n "__fish_ftpipe_needs_command" -f -a "pull" -d 'Download the artifact published at s3://BUCKET/PREFIX into DIR/artifact with the fetch\'s resume and verification'
complete -c ftpipe -n "__fish_ftpipe_needs_command" -f -a "mirror" -d 'Mirror DIR\'s pinned, fully fetched sources to s3://BUCKET/PREFIX (files, then listing.json), for `--endpoint s3://BUCKET/PREFIX`'
complete -c ftpipe -n "__fish_ftpipe_needs_command" -f -a "inspect" -d 'Show what an FTW v1, FTEXPERT1 or safetensors file holds (header only)'
complete -c ftpipe -n "__fish_ftpipe_needs_command" -f -a "verify" -d 'Check an artifact directory on its own: no database, sources or network'
complete -c ftpipe -n "__fish_ftpipe_needs_command" -f -a "demo" -d 'Serve a generated checkpoint locally, run the whole pipeline with a crash during download and one during conversion, resume, verify and audit'
complete -c ftpipe -n "__fish_ftpipe_needs_command" -f -a "completions" -d 'Print the completion script of a shell'
complete -c ftpipe -n "__fish_ftpipe_needs_command" -f -a "man" -d 'Print the man page of ftpipe or of one command, or write them all'
complete -c ftpipe -n "__fish_ftpipe_needs_command" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand fetch" -l out -d 'DIR: where the pin, the state, the sources and the artifact live' -r -F
complete -c ftpipe -n "__fish_ftpipe_using_subcommand fetch" -l revision -d 'The branch, tag or commit to pin' -r
complete -c ftpipe -n "__fish_ftpipe_using_subcommand fetch" -l endpoint -d 'Hub endpoint (else HF_ENDPOINT, else https://huggingface.co), or a mirror in object storage, s3://BUCKET/PREFIX (`ftpipe mirror` writes one)' -r
complete -c ftpipe -n "__fish_ftpipe_using_subcommand fetch" -l s3-endpoint -d 'S3-compatible endpoint URL (else AWS_ENDPOINT_URL_S3, else AWS_ENDPOINT_URL, else the profile\'s endpoint_url, else AWS). Plain http is accepted, with a warning unless the host is loopback. Credentials and region come from the AWS default chain: the environment, AWS_PROFILE in ~/.aws/credentials and ~/.aws/config (keys, credential_process, sso, role_arn), web identity (AWS_WEB_IDENTITY_TOKEN_FILE + AWS_ROLE_ARN), container credentials, the instance profile; the region else us-east-1' -r
complete -c ftpipe -n "__fish_ftpipe_using_subcommand fetch" -l token-file -d 'Read the token from this file (else HF_TOKEN, else the file at HF_TOKEN_PATH, default $HF_HOME/token, as `hf auth login` leaves it)' -r -F
complete -c ftpipe -n "__fish_ftpipe_using_subcommand fetch" -l hf-cache -d 'Take pinned files from this Hugging Face hub cache (default: HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub, when it exists)' -r -F
complete -c ftpipe -n "__fish_ftpipe_using_subcommand fetch" -l read-timeout -d 'No byte for this many seconds (waiting for an answer or inside its body) ends the attempt, which is then retried (0.1 to 3600)' -r
complete -c ftpipe -n "__fish_ftpipe_using_subcommand fetch" -l include -d 'Only files matching these globs' -r
complete -c ftpipe -n "__fish_ftpipe_using_subcommand fetch" -l exclude -d 'Skip files matching these globs' -r
complete -c ftpipe -n "__fish_ftpipe_using_subcommand fetch" -l jobs -d 'Files transferred in parallel (1 to 64, default 4; at most --connections at once). For `run`: the default of both --fetch-jobs and --convert-jobs' -r
complete -c ftpipe -n "__fish_ftpipe_using_subcommand fetch" -l connections -d 'HTTP requests in flight at once over all files (1 to 64): each file takes one, free ones split large files into ranges' -r
complete -c ftpipe -n "__fish_ftpipe_using_subcommand fetch" -l segment-threshold -d 'Files at least this large may be fetched as several ranges (e.g. 256MiB)' -r
complete -c ftpipe -n "__fish_ftpipe_using_subcommand fetch" -l min-range -d 'A range is never split below this size (e.g. 4MiB; at least 64KiB)' -r
complete -c ftpipe -n "__fish_ftpipe_using_subcommand fetch" -l piece-size -d 'Ranges are claimed front to back in pieces of at least this size (e.g. 64MiB), so a split file\'s digest keeps up with its bytes' -r
complete -c ftpipe -n "__fish_ftpipe_using_subcommand fetch" -l split-below-rate -d 'A file gets another connection only while its connections each deliver less than this per second (e.g. 128MiB, about 1 Gbit/s; 0: always): faster ones are limited by this machine, not the server. Once a file\'s connections were found slower, the later files from the same host are split from their start' -r
complete -c ftpipe -n "__fish_ftpipe_using_subcommand fetch" -l checkpoint-bytes -d 'Durable checkpoint interval in bytes of a file (at least 1; default: 1/256 of the file\'s size, between 4 MiB and 64 MiB, so a kill costs a large file at most about 0.4 % of its bytes)' -r
complete -c ftpipe -n "__fish_ftpipe_using_subcommand fetch" -l retries -d 'Retries per file for transient failures (0 to 100)' -r
complete -c ftpipe -n "__fish_ftpipe_using_subcommand fetch" -l retry-base-ms -d 'First retry delay in milliseconds (1 to 60000)' -r
complete -c ftpipe -n "__fish_ftpipe_using_subcommand fetch" -l checkpoint-secs -d 'Durable checkpoint interval in seconds (0.01 to 3600)' -r
complete -c ftpipe -n "__fish_ftpipe_using_subcommand fetch" -l min-rate -d 'Minimum body rate in bytes per second, averaged over --stall-secs; a slower transfer is a stall and retried (0: no rate rule)' -r
complete -c ftpipe -n "__fish_ftpipe_using_subcommand fetch" -l stall-secs -d 'Window of the --min-rate rule in seconds (0.1 to 3600)' -r
complete -c ftpipe -n "__fish_ftpipe_using_subcommand fetch" -l reuse-from -d 'Another output directory of an earlier fetch (of this or another revision): Xet terms whose chunks its files hold are read from them, each chunk checked against its recorded hash, instead of fetched (its state database is only read, never locked)' -r -F
complete -c ftpipe -n "__fish_ftpipe_using_subcommand fetch" -l no-hf-cache -d 'Never look in a Hugging Face cache'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand fetch" -l offline -d 'No network: work from DIR\'s durable state and the cache only (also HF_HUB_OFFLINE=1)'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand fetch" -l no-xet -d 'Fetch files the hub keeps in Xet storage through `resolve` like any other, not by reconstruction from its CAS (also HF_HUB_DISABLE_XET=1)'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand fetch" -l buffered-io -d 'Write downloaded files through the page cache. By default their whole blocks bypass it (O_DIRECT) where the volume allows and does not keep its files in memory (tmpfs): each byte is written once and hashed from memory, so caching it only costs a copy and evicts other data. `run --disk-budget` always writes through it: each shard it admits is read back at once, and the budget bounds what it holds'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand fetch" -l quiet -d 'Print nothing on success (errors still go to stderr)'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand fetch" -l json -d 'Newline-delimited JSON events and a JSON summary'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand fetch" -l repin -d 'Follow a moved branch instead of keeping the pin'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand fetch" -l no-preflight -d 'Skip the free-space check before starting'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand fetch" -l reacquire -d 'Fetch again the sources `convert --retire-sources` deleted'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand fetch" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand status" -l out -d 'DIR: the directory whose state is shown' -r -F
complete -c ftpipe -n "__fish_ftpipe_using_subcommand status" -l json -d 'Print one JSON object'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand status" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand audit" -l out -d 'DIR: the directory audited' -r -F
complete -c ftpipe -n "__fish_ftpipe_using_subcommand audit" -l bundle -d 'Also write a zstd-compressed evidence bundle (tar) to this file; it is refused if any entry holds the token (resolved as the fetching commands do, so `--token-file` here names the same file)' -r -F
complete -c ftpipe -n "__fish_ftpipe_using_subcommand audit" -l token-file -d 'The token file the fetching commands were given, so the bundle guard knows that token too' -r -F
complete -c ftpipe -n "__fish_ftpipe_using_subcommand audit" -l deep -d 'Re-hash every source and component'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand audit" -l json -d 'Print the report as one JSON object'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand audit" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand plan" -l out -d 'DIR: where the pin, the state, the sources and the artifact live' -r -F
complete -c ftpipe -n "__fish_ftpipe_using_subcommand plan" -l revision -d 'The branch, tag or commit to pin' -r
complete -c ftpipe -n "__fish_ftpipe_using_subcommand plan" -l endpoint -d 'Hub endpoint (else HF_ENDPOINT, else https://huggingface.co), or a mirror in object storage, s3://BUCKET/PREFIX (`ftpipe mirror` writes one)' -r
complete -c ftpipe -n "__fish_ftpipe_using_subcommand plan" -l s3-endpoint -d 'S3-compatible endpoint URL (else AWS_ENDPOINT_URL_S3, else AWS_ENDPOINT_URL, else the profile\'s endpoint_url, else AWS). Plain http is accepted, with a warning unless the host is loopback. Credentials and region come from the AWS default chain: the environment, AWS_PROFILE in ~/.aws/credentials and ~/.aws/config (keys, credential_process, sso, role_arn), web identity (AWS_WEB_IDENTITY_TOKEN_FILE + AWS_ROLE_ARN), container credentials, the instance profile; the region else us-east-1' -r
complete -c ftpipe -n "__fish_ftpipe_using_subcommand plan" -l token-file -d 'Read the token from this file (else HF_TOKEN, else the file at HF_TOKEN_PATH, default $HF_HOME/token, as `hf auth login` leaves it)' -r -F
complete -c ftpipe -n "__fish_ftpipe_using_subcommand plan" -l hf-cache -d 'Take pinned files from this Hugging Face hub cache (default: HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub, when it exists)' -r -F
complete -c ftpipe -n "__fish_ftpipe_using_subcommand plan" -l read-timeout -d 'No byte for this many seconds (waiting for an answer or inside its body) ends the attempt, which is then retried (0.1 to 3600)' -r
complete -c ftpipe -n "__fish_ftpipe_using_subcommand plan" -l recipe -d 'Plan with this declarative TOML recipe instead of a built-in profile' -r -F
complete -c ftpipe -n "__fish_ftpipe_using_subcommand plan" -l include -d 'Plan for a fetch of only the files matching these globs (default: the selection DIR was pinned with)' -r
complete -c ftpipe -n "__fish_ftpipe_using_subcommand plan" -l exclude -d 'Plan for a fetch that skips the files matching these globs' -r
complete -c ftpipe -n "__fish_ftpipe_using_subcommand plan" -l disk-budget -d 'Also schedule fetch, conversion and retirement so that the source bytes on disk never exceed SIZE (e.g. 380GB = 380·10^9 bytes, 100GiB = 100·2^30): prints the predicted peak disk against an unbudgeted run, and the minimum feasible budget (a smaller SIZE is refused, naming it)' -r
complete -c ftpipe -n "__fish_ftpipe_using_subcommand plan" -l no-hf-cache -d 'Never look in a Hugging Face cache'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand plan" -l offline -d 'No network: work from DIR\'s durable state and the cache only (also HF_HUB_OFFLINE=1)'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand plan" -l no-xet -d 'Fetch files the hub keeps in Xet storage through `resolve` like any other, not by reconstruction from its CAS (also HF_HUB_DISABLE_XET=1)'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand plan" -l remote -d 'Read only the safetensors headers from the hub (HTTP Range), no weights. Without it, plan from the sources in DIR/source/'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand plan" -l json -d 'Print one JSON object'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand plan" -l repin -d 'With --remote on a DIR holding an artifact: plan the revision\'s current commit and say what `run --repin` will fetch and which components it keeps, checks after the fetch, or converts again'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand plan" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand convert" -l out -d 'DIR: its sources (DIR/source) are converted into DIR/artifact' -r -F
complete -c ftpipe -n "__fish_ftpipe_using_subcommand convert" -l jobs -d 'Components converted in parallel (1 to 64)' -r
complete -c ftpipe -n "__fish_ftpipe_using_subcommand convert" -l protect -d 'Also keep tensors matching this glob BF16 and mark them protected (repeatable; part of the converter identity)' -r
complete -c ftpipe -n "__fish_ftpipe_using_subcommand convert" -l recipe -d 'Convert with this declarative TOML recipe (glob → component, dtype policy) instead of a built-in profile' -r -F
complete -c ftpipe -n "__fish_ftpipe_using_subcommand convert" -l ram-budget -d 'RAM budget for placing expert layers (e.g. 64GiB; default 0: all file tier)' -r
complete -c ftpipe -n "__fish_ftpipe_using_subcommand convert" -l reserve -d 'Part of the RAM budget kept free (e.g. 2GiB)' -r
complete -c ftpipe -n "__fish_ftpipe_using_subcommand convert" -l retire-sources -d 'Delete each source shard once every component reading it is durable'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand convert" -l rebuild -d 'Set a stale artifact aside (kept as evidence) and rebuild it'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand convert" -l no-preflight -d 'Skip the free-space check before starting'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand convert" -l quiet -d 'Print nothing on success (errors still go to stderr)'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand convert" -l json -d 'Newline-delimited JSON events and a JSON summary'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand convert" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand run" -l out -d 'DIR: where the pin, the state, the sources and the artifact live' -r -F
complete -c ftpipe -n "__fish_ftpipe_using_subcommand run" -l revision -d 'The branch, tag or commit to pin' -r
complete -c ftpipe -n "__fish_ftpipe_using_subcommand run" -l endpoint -d 'Hub endpoint (else HF_ENDPOINT, else https://huggingface.co), or a mirror in object storage, s3://BUCKET/PREFIX (`ftpipe mirror` writes one)' -r
complete -c ftpipe -n "__fish_ftpipe_using_subcommand run" -l s3-endpoint -d 'S3-compatible endpoint URL (else AWS_ENDPOINT_URL_S3, else AWS_ENDPOINT_URL, else the profile\'s endpoint_url, else AWS). Plain http is accepted, with a warning unless the host is loopback. Credentials and region come from the AWS default chain: the environment, AWS_PROFILE in ~/.aws/credentials and ~/.aws/config (keys, credential_process, sso, role_arn), web identity (AWS_WEB_IDENTITY_TOKEN_FILE + AWS_ROLE_ARN), container credentials, the instance profile; the region else us-east-1' -r
complete -c ftpipe -n "__fish_ftpipe_using_subcommand run" -l token-file -d 'Read the token from this file (else HF_TOKEN, else the file at HF_TOKEN_PATH, default $HF_HOME/token, as `hf auth login` leaves it)' -r -F
complete -c ftpipe -n "__fish_ftpipe_using_subcommand run" -l hf-cache -d 'Take pinned files from this Hugging Face hub cache (default: HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub, when it exists)' -r -F
complete -c ftpipe -n "__fish_ftpipe_using_subcommand run" -l read-timeout -d 'No byte for this many seconds (waiting for an answer or inside its body) ends the attempt, which is then retried (0.1 to 3600)' -r
complete -c ftpipe -n "__fish_ftpipe_using_subcommand run" -l include -d 'Only files matching these globs' -r
complete -c ftpipe -n "__fish_ftpipe_using_subcommand run" -l exclude -d 'Skip files matching these globs' -r
complete -c ftpipe -n "__fish_ftpipe_using_subcommand run" -l jobs -d 'Files transferred in parallel (1 to 64, default 4; at most --connections at once). For `run`: the default of both --fetch-jobs and --convert-jobs' -r
complete -c ftpipe -n "__fish_ftpipe_using_subcommand run" -l connections -d 'HTTP requests in flight at once over all files (1 to 64): each file takes one, free ones split large files into ranges' -r
complete -c ftpipe -n "__fish_ftpipe_using_subcommand run" -l segment-threshold -d 'Files at least this large may be fetched as several ranges (e.g. 256MiB)' -r
complete -c ftpipe -n "__fish_ftpipe_using_subcommand run" -l min-range -d 'A range is never split below this size (e.g. 4MiB; at least 64KiB)' -r
complete -c ftpipe -n "__fish_ftpipe_using_subcommand run" -l piece-size -d 'Ranges are claimed front to back in pieces of at least this size (e.g. 64MiB), so a split file\'s digest keeps up with its bytes' -r
complete -c ftpipe -n "__fish_ftpipe_using_subcommand run" -l split-below-rate -d 'A file gets another connection only while its connections each deliver less than this per second (e.g. 128MiB, about 1 Gbit/s; 0: always): faster ones are limited by this machine, not the server. Once a file\'s connections were found slower, the later files from the same host are split from their start' -r
complete -c ftpipe -n "__fish_ftpipe_using_subcommand run" -l checkpoint-bytes -d 'Durable checkpoint interval in bytes of a file (at least 1; default: 1/256 of the file\'s size, between 4 MiB and 64 MiB, so a kill costs a large file at most about 0.4 % of its bytes)' -r
complete -c ftpipe -n "__fish_ftpipe_using_subcommand run" -l retries -d 'Retries per file for transient failures (0 to 100)' -r
complete -c ftpipe -n "__fish_ftpipe_using_subcommand run" -l retry-base-ms -d 'First retry delay in milliseconds (1 to 60000)' -r
complete -c ftpipe -n "__fish_ftpipe_using_subcommand run" -l checkpoint-secs -d 'Durable checkpoint interval in seconds (0.01 to 3600)' -r
complete -c ftpipe -n "__fish_ftpipe_using_subcommand run" -l min-rate -d 'Minimum body rate in bytes per second, averaged over --stall-secs; a slower transfer is a stall and retried (0: no rate rule)' -r
complete -c ftpipe -n "__fish_ftpipe_using_subcommand run" -l stall-secs -d 'Window of the --min-rate rule in seconds (0.1 to 3600)' -r
complete -c ftpipe -n "__fish_ftpipe_using_subcommand run" -l reuse-from -d 'Another output directory of an earlier fetch (of this or another revision): Xet terms whose chunks its files hold are read from them, each chunk checked against its recorded hash, instead of fetched (its state database is only read, never locked)' -r -F
complete -c ftpipe -n "__fish_ftpipe_using_subcommand run" -l fetch-jobs -d 'Files the fetch stage transfers in parallel (1 to 64; default --jobs, else 4, as `fetch`)' -r
complete -c ftpipe -n "__fish_ftpipe_using_subcommand run" -l convert-jobs -d 'Components the convert stage converts in parallel (1 to 64; default --jobs, else 2, as `convert`)' -r
complete -c ftpipe -n "__fish_ftpipe_using_subcommand run" -l protect -d 'Also keep tensors matching this glob BF16 and mark them protected (repeatable; part of the converter identity)' -r
complete -c ftpipe -n "__fish_ftpipe_using_subcommand run" -l recipe -d 'Convert with this declarative TOML recipe (glob → component, dtype policy) instead of a built-in profile' -r -F
complete -c ftpipe -n "__fish_ftpipe_using_subcommand run" -l ram-budget -d 'RAM budget for placing expert layers (e.g. 64GiB; default 0: all file tier)' -r
complete -c ftpipe -n "__fish_ftpipe_using_subcommand run" -l reserve -d 'Part of the RAM budget kept free (e.g. 2GiB)' -r
complete -c ftpipe -n "__fish_ftpipe_using_subcommand run" -l disk-budget -d 'Build while downloading so that the source bytes on disk (config, index, every shard admitted and not yet deleted, a `.part` counted whole) never exceed SIZE (e.g. 120GB = 120·10^9 bytes, 100GiB = 100·2^30): each shard is converted as soon as it is verified and deleted once nothing unfinished needs it. A SIZE below the minimum `plan --remote --disk-budget` reports is refused before any shard is fetched' -r
complete -c ftpipe -n "__fish_ftpipe_using_subcommand run" -l no-hf-cache -d 'Never look in a Hugging Face cache'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand run" -l offline -d 'No network: work from DIR\'s durable state and the cache only (also HF_HUB_OFFLINE=1)'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand run" -l no-xet -d 'Fetch files the hub keeps in Xet storage through `resolve` like any other, not by reconstruction from its CAS (also HF_HUB_DISABLE_XET=1)'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand run" -l buffered-io -d 'Write downloaded files through the page cache. By default their whole blocks bypass it (O_DIRECT) where the volume allows and does not keep its files in memory (tmpfs): each byte is written once and hashed from memory, so caching it only costs a copy and evicts other data. `run --disk-budget` always writes through it: each shard it admits is read back at once, and the budget bounds what it holds'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand run" -l quiet -d 'Print nothing on success (errors still go to stderr)'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand run" -l json -d 'Newline-delimited JSON events and a JSON summary'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand run" -l repin -d 'Follow a moved branch instead of keeping the pin'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand run" -l no-preflight -d 'Skip the free-space check before starting'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand run" -l reacquire -d 'Fetch again the sources `convert --retire-sources` deleted'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand run" -l retire-sources -d 'Delete each source shard once every component reading it is durable'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand run" -l rebuild -d 'Set a stale artifact aside (kept as evidence) and rebuild it'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand run" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand publish" -l s3-endpoint -d 'S3-compatible endpoint URL (else AWS_ENDPOINT_URL_S3, else AWS_ENDPOINT_URL, else the profile\'s endpoint_url, else AWS). Plain http is accepted, with a warning unless the host is loopback. Credentials and region come from the AWS default chain: the environment, AWS_PROFILE in ~/.aws/credentials and ~/.aws/config (keys, credential_process, sso, role_arn), web identity (AWS_WEB_IDENTITY_TOKEN_FILE + AWS_ROLE_ARN), container credentials, the instance profile; the region else us-east-1' -r
complete -c ftpipe -n "__fish_ftpipe_using_subcommand publish" -l mount-from -d 'Mount blobs the oci:// destination lacks from this repository of the same registry (a cross-repository mount: nothing is sent for a blob the registry links; one it does not is uploaded)' -r
complete -c ftpipe -n "__fish_ftpipe_using_subcommand publish" -l part-size -d 'Part size of multipart uploads; smaller files go in one put (at least 64KiB; S3 itself needs 5MiB). Default: chosen per file, 8MiB up to a 32nd of the file (a power of two, at most 64MiB, more only past 10,000 parts), for S3 parts and a registry\'s chunks alike' -r
complete -c ftpipe -n "__fish_ftpipe_using_subcommand publish" -l concurrency -d 'Parts in flight at once (1 to 64). Default: chosen per file, 2 to 8 within 256MiB of parts in memory. `publish` also sends at most this many files of one put at once (default: up to 8 within 256MiB)' -r
complete -c ftpipe -n "__fish_ftpipe_using_subcommand publish" -l read-timeout -d 'No byte for this many seconds (waiting for an answer or inside its body) ends the attempt, which is then retried (0.1 to 3600)' -r
complete -c ftpipe -n "__fish_ftpipe_using_subcommand publish" -l plain-http -d 'Speak plain http to the registry of an oci:// reference (a loopback or test registry; a warning for any other host). Credentials come from REGISTRY_AUTH_FILE, $XDG_RUNTIME_DIR/containers/auth.json or ~/.docker/config.json (`credHelpers`, `auths`, `credsStore`: a docker-credential-NAME helper on PATH, given --read-timeout); a registry\'s Bearer challenge is answered with a token from its realm, which must be on the registry\'s host'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand publish" -l force-tag -d 'Move the tag of an oci:// destination when it names another artifact (refused otherwise)'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand publish" -l quiet -d 'Print nothing on success (errors still go to stderr)'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand publish" -l json -d 'A JSON summary'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand publish" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand pull" -l out -d 'DIR: the artifact is pulled into DIR/artifact' -r -F
complete -c ftpipe -n "__fish_ftpipe_using_subcommand pull" -l s3-endpoint -d 'S3-compatible endpoint URL (else AWS_ENDPOINT_URL_S3, else AWS_ENDPOINT_URL, else the profile\'s endpoint_url, else AWS). Plain http is accepted, with a warning unless the host is loopback. Credentials and region come from the AWS default chain: the environment, AWS_PROFILE in ~/.aws/credentials and ~/.aws/config (keys, credential_process, sso, role_arn), web identity (AWS_WEB_IDENTITY_TOKEN_FILE + AWS_ROLE_ARN), container credentials, the instance profile; the region else us-east-1' -r
complete -c ftpipe -n "__fish_ftpipe_using_subcommand pull" -l read-timeout -d 'No byte for this many seconds (waiting for an answer or inside its body) ends the attempt, which is then retried (0.1 to 3600)' -r
complete -c ftpipe -n "__fish_ftpipe_using_subcommand pull" -l jobs -d 'Files transferred in parallel (1 to 64)' -r
complete -c ftpipe -n "__fish_ftpipe_using_subcommand pull" -l connections -d 'Requests in flight at once over all files (1 to 64): free ones split large objects into ranges' -r
complete -c ftpipe -n "__fish_ftpipe_using_subcommand pull" -l segment-threshold -d 'Objects at least this large may be fetched as several ranges' -r
complete -c ftpipe -n "__fish_ftpipe_using_subcommand pull" -l min-range -d 'A range is never split below this size (at least 64KiB)' -r
complete -c ftpipe -n "__fish_ftpipe_using_subcommand pull" -l piece-size -d 'Ranges are claimed front to back in pieces of at least this size' -r
complete -c ftpipe -n "__fish_ftpipe_using_subcommand pull" -l split-below-rate -d 'An object gets another connection only while its connections each deliver less than this per second (default 0: always, as every S3 client reads a large object: a store serves each connection at a limited rate, and one that is near the limit made the split a coin toss that doubled the pull\'s time)' -r
complete -c ftpipe -n "__fish_ftpipe_using_subcommand pull" -l checkpoint-bytes -d 'Durable checkpoint interval in bytes of a file (at least 1; default: 1/256 of the file\'s size, between 4 MiB and 64 MiB, so a kill costs a large file at most about 0.4 % of its bytes)' -r
complete -c ftpipe -n "__fish_ftpipe_using_subcommand pull" -l retries -d 'Retries per file for transient failures (0 to 100)' -r
complete -c ftpipe -n "__fish_ftpipe_using_subcommand pull" -l retry-base-ms -d 'First retry delay in milliseconds (1 to 60000)' -r
complete -c ftpipe -n "__fish_ftpipe_using_subcommand pull" -l plain-http -d 'Speak plain http to the registry of an oci:// reference (a loopback or test registry; a warning for any other host). Credentials come from REGISTRY_AUTH_FILE, $XDG_RUNTIME_DIR/containers/auth.json or ~/.docker/config.json (`credHelpers`, `auths`, `credsStore`: a docker-credential-NAME helper on PATH, given --read-timeout); a registry\'s Bearer challenge is answered with a token from its realm, which must be on the registry\'s host'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand pull" -l repin -d 'When the oci:// tag names another manifest than the one DIR pinned, start over from the new one (refused otherwise)'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand pull" -l buffered-io -d 'Write through the page cache instead of O_DIRECT'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand pull" -l no-preflight -d 'Skip the free-space check before starting'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand pull" -l quiet -d 'Print nothing on success (errors still go to stderr)'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand pull" -l json -d 'Newline-delimited JSON events and a JSON summary'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand pull" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand mirror" -l out -d 'With a REPO: the directory its sources are fetched into first' -r -F
complete -c ftpipe -n "__fish_ftpipe_using_subcommand mirror" -l revision -d 'With a REPO: the revision to pin' -r
complete -c ftpipe -n "__fish_ftpipe_using_subcommand mirror" -l endpoint -d 'With a REPO: the hub endpoint (else HF_ENDPOINT, else https://huggingface.co)' -r
complete -c ftpipe -n "__fish_ftpipe_using_subcommand mirror" -l token-file -d 'With a REPO: read the hub token from this file (else HF_TOKEN, else the file at HF_TOKEN_PATH or $HF_HOME/token)' -r -F
complete -c ftpipe -n "__fish_ftpipe_using_subcommand mirror" -l s3-endpoint -d 'S3-compatible endpoint URL (else AWS_ENDPOINT_URL_S3, else AWS_ENDPOINT_URL, else the profile\'s endpoint_url, else AWS). Plain http is accepted, with a warning unless the host is loopback. Credentials and region come from the AWS default chain: the environment, AWS_PROFILE in ~/.aws/credentials and ~/.aws/config (keys, credential_process, sso, role_arn), web identity (AWS_WEB_IDENTITY_TOKEN_FILE + AWS_ROLE_ARN), container credentials, the instance profile; the region else us-east-1' -r
complete -c ftpipe -n "__fish_ftpipe_using_subcommand mirror" -l part-size -d 'Part size of multipart uploads; smaller files go in one put (at least 64KiB; S3 itself needs 5MiB). Default: chosen per file, 8MiB up to a 32nd of the file (a power of two, at most 64MiB, more only past 10,000 parts), for S3 parts and a registry\'s chunks alike' -r
complete -c ftpipe -n "__fish_ftpipe_using_subcommand mirror" -l concurrency -d 'Parts in flight at once (1 to 64). Default: chosen per file, 2 to 8 within 256MiB of parts in memory. `publish` also sends at most this many files of one put at once (default: up to 8 within 256MiB)' -r
complete -c ftpipe -n "__fish_ftpipe_using_subcommand mirror" -l read-timeout -d 'No byte for this many seconds (waiting for an answer or inside its body) ends the attempt, which is then retried (0.1 to 3600)' -r
complete -c ftpipe -n "__fish_ftpipe_using_subcommand mirror" -l quiet -d 'Print nothing on success (errors still go to stderr)'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand mirror" -l json -d 'A JSON summary'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand mirror" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand inspect" -l json -d 'Print one JSON object'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand inspect" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand verify" -l deep -d 'Also re-hash every component'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand verify" -l json -d 'Print the report as one JSON object'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand verify" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand demo" -l out -d 'Where to leave the result (default: a new temp dir); with --serve, where the printed commands put theirs' -r -F
complete -c ftpipe -n "__fish_ftpipe_using_subcommand demo" -l serve -d 'Keep the checkpoint served on loopback until Ctrl-C (nothing is run): try the commands it prints from another shell'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand demo" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand completions" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand man" -l dir -d 'Write ftpipe.1 and ftpipe-COMMAND.1 for every command into DIR' -r -F
complete -c ftpipe -n "__fish_ftpipe_using_subcommand man" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand help; and not __fish_seen_subcommand_from fetch status audit plan convert run publish pull mirror inspect verify demo completions man help" -f -a "fetch" -d 'Download a pinned repo into DIR/source with strict Range resume'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand help; and not __fish_seen_subcommand_from fetch status audit plan convert run publish pull mirror inspect verify demo completions man help" -f -a "status" -d 'Show the pin, stage states and byte counts of DIR'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand help; and not __fish_seen_subcommand_from fetch status audit plan convert run publish pull mirror inspect verify demo completions man help" -f -a "audit" -d 'Reconcile the byte ledger against receipts and files on disk'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand help; and not __fish_seen_subcommand_from fetch status audit plan convert run publish pull mirror inspect verify demo completions man help" -f -a "plan" -d 'Predict every output component\'s exact size before converting'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand help; and not __fish_seen_subcommand_from fetch status audit plan convert run publish pull mirror inspect verify demo completions man help" -f -a "convert" -d 'Convert DIR/source into the artifact in DIR/artifact (resumable)'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand help; and not __fish_seen_subcommand_from fetch status audit plan convert run publish pull mirror inspect verify demo completions man help" -f -a "run" -d 'resolve → plan → fetch → convert → verify, each a durable stage'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand help; and not __fish_seen_subcommand_from fetch status audit plan convert run publish pull mirror inspect verify demo completions man help" -f -a "publish" -d 'Upload DIR\'s verified artifact to s3://BUCKET/PREFIX: components (resumable multipart uploads), each checked, then manifest.json, create-only'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand help; and not __fish_seen_subcommand_from fetch status audit plan convert run publish pull mirror inspect verify demo completions man help" -f -a "pull" -d 'Download the artifact published at s3://BUCKET/PREFIX into DIR/artifact with the fetch\'s resume and verification'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand help; and not __fish_seen_subcommand_from fetch status audit plan convert run publish pull mirror inspect verify demo completions man help" -f -a "mirror" -d 'Mirror DIR\'s pinned, fully fetched sources to s3://BUCKET/PREFIX (files, then listing.json), for `--endpoint s3://BUCKET/PREFIX`'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand help; and not __fish_seen_subcommand_from fetch status audit plan convert run publish pull mirror inspect verify demo completions man help" -f -a "inspect" -d 'Show what an FTW v1, FTEXPERT1 or safetensors file holds (header only)'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand help; and not __fish_seen_subcommand_from fetch status audit plan convert run publish pull mirror inspect verify demo completions man help" -f -a "verify" -d 'Check an artifact directory on its own: no database, sources or network'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand help; and not __fish_seen_subcommand_from fetch status audit plan convert run publish pull mirror inspect verify demo completions man help" -f -a "demo" -d 'Serve a generated checkpoint locally, run the whole pipeline with a crash during download and one during conversion, resume, verify and audit'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand help; and not __fish_seen_subcommand_from fetch status audit plan convert run publish pull mirror inspect verify demo completions man help" -f -a "completions" -d 'Print the completion script of a shell'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand help; and not __fish_seen_subcommand_from fetch status audit plan convert run publish pull mirror inspect verify demo completions man help" -f -a "man" -d 'Print the man page of ftpipe or of one command, or write them all'
complete -c ftpipe -n "__fish_ftpipe_using_subcommand help; and not __fish_seen_subcommand_from fetch status audit plan convert run publish pull mirror inspect verify demo completions man help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
