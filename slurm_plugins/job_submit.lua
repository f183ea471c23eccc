--[[
dlsub's job_submit plugin (Slurm's job_submit/lua), installed as
/etc/slurm/job_submit.lua with `JobSubmitPlugins=lua` in slurm.conf.

A job's --comment is public and its owner may rewrite it at any time
(`scontrol update Comment=`), so the dlsub agent, a Slurm Operator, must not
trust the GPUs, partition or time a comment names. This plugin runs inside
slurmctld at submit time and freezes what the job really asked for into
its AdminComment, which only Slurm administrators can update (an Operator
cannot set it in 22.05, its user cannot change it):

  dlsub-submit:v1;uid=1001;partition=cpu;time=60;tres=gres:gpu:1|<comment as submitted>

Exactly what dlsub.contract.SubmitRecord.parse reads. `time` is minutes,
empty when the job gave none (the partition's default applies); `tres` is
Slurm's own TresPerNode (what --gres/--gpus-per-node asked for), empty when
none; `partition` is empty for the default partition.

A field holding a character the record format does not allow (a partition
name with `;` or `|` in it, say) would let a user forge another field, so
such a job gets no record at all: the agent then leaves it alone.
Any other job's AdminComment that claims to be a dlsub record is cleared
(sbatch has no option to set one in 22.05; other clients of the API might).
Never rejects a job: it only records.
--]]

local COMMENT_PREFIX = "dlsub:"
local RECORD_PREFIX = "dlsub-submit:"
local RECORD_VERSION = "dlsub-submit:v1;"
local NO_VAL = 4294967294 -- Slurm's NO_VAL: no --time given
local MAX_RECORD = 1024 -- SubmitRecord.parse reads no more

local function starts_with(text, prefix)
   return type(text) == "string" and string.sub(text, 1, string.len(prefix)) == prefix
end

-- A field value as SubmitRecord.parse accepts it ([A-Za-z0-9._:,/=-]{0,128}), or nil.
local function field(value)
   if value == nil then
      return ""
   end
   value = tostring(value)
   if string.len(value) > 128 or string.find(value, "[^%w%._:,/=%-]") then
      return nil
   end
   return value
end

local function whole(number)
   return string.format("%d", math.floor(tonumber(number)))
end

-- The record for a dlsub job, or nil when one of its fields cannot be written safely.
local function submit_record(job_desc)
   local comment = job_desc.comment
   if string.find(comment, "[\r\n]") then
      return nil
   end
   local time = ""
   if job_desc.time_limit ~= nil and tonumber(job_desc.time_limit) ~= NO_VAL then
      time = whole(job_desc.time_limit)
   end
   local partition = field(job_desc.partition)
   local tres = field(job_desc.tres_per_node)
   if job_desc.user_id == nil or partition == nil or tres == nil then
      return nil
   end
   local record = RECORD_VERSION .. "uid=" .. whole(job_desc.user_id) .. ";partition=" .. partition
      .. ";time=" .. time .. ";tres=" .. tres .. "|" .. comment
   if string.len(record) > MAX_RECORD then
      return nil
   end
   return record
end

function slurm_job_submit(job_desc, part_list, submit_uid)
   if starts_with(job_desc.comment, COMMENT_PREFIX) then
      local record = submit_record(job_desc)
      if record == nil then
         slurm.log_info("dlsub: job of uid %s: comment or request not recordable; no submit record",
                        tostring(job_desc.user_id))
      end
      -- "" clears (the plugin takes no nil here) whatever the submitter put there itself.
      job_desc.admin_comment = record or ""
   elseif starts_with(job_desc.admin_comment, RECORD_PREFIX) then
      job_desc.admin_comment = ""
   end
   return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
   -- Users cannot update AdminComment (Slurm refuses them); the record stays as submitted.
   return slurm.SUCCESS
end

return slurm.SUCCESS
