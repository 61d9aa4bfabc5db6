-- vipu's job_submit filter for Slurm's job_submit/lua plugin: a job's --ipus=N becomes a request
-- of N licences "ipu", so that Slurm starts it only while N IPUs are free and otherwise keeps it
-- PENDING with its own reason (Licenses). A later change of the job's licences (scontrol update
-- Licenses=...) keeps that count: a job cannot escape it.
--
-- Install it as job_submit.lua beside slurm.conf, with
--     JobSubmitPlugins=lua
--     Licenses=ipu:N           (N: the IPUs of the allocations vipu gives Slurm's user)
-- vipu's SPANK plugin checks --ipus at submission and hands it on in the job's SPANK environment
-- as VIPU_IPUS=N; vipu-slurm-service (or vipu-slurm-licences) keeps the licences free equal to the
-- IPUs free, by reserving those that partitions made outside Slurm hold.

local LICENCE = "ipu"

-- The IPUs the job asked for with --ipus, or nil.
local function requested_ipus(job_desc)
    local env = job_desc.spank_job_env
    if env == nil then
        return nil
    end
    for _, variable in pairs(env) do
        local count = string.match(variable, "^VIPU_IPUS=(%d+)$")
        if count ~= nil then
            return tonumber(count)
        end
    end
    return nil
end

-- The job's licences with its IPUs among them, in place of any "ipu" it asked for itself.
local function with_ipus(licenses, ipus)
    local kept = {}
    if licenses ~= nil and licenses ~= "" then
        for item in string.gmatch(licenses, "[^,]+") do
            local name = string.match(item, "^([^:]+)")
            if name ~= LICENCE then
                table.insert(kept, item)
            end
        end
    end
    table.insert(kept, LICENCE .. ":" .. ipus)
    return table.concat(kept, ",")
end

-- The count of licences "ipu" in a job's licences ("ipu:4,other:1"), or nil.
local function licensed_ipus(licenses)
    if licenses == nil then
        return nil
    end
    for item in string.gmatch(licenses, "[^,]+") do
        local name, count = string.match(item, "^([^:]+):?(%d*)$")
        if name == LICENCE then
            return tonumber(count) or 1
        end
    end
    return nil
end

function slurm_job_submit(job_desc, part_list, submit_uid)
    local ipus = requested_ipus(job_desc)
    if ipus ~= nil and ipus > 0 then
        job_desc.licenses = with_ipus(job_desc.licenses, ipus)
    end
    return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
    if job_desc.licenses == nil then
        return slurm.SUCCESS
    end
    -- The job's IPUs are what its licences "ipu" count since its submission: asked for with --ipus,
    -- they stay asked for whatever licences the change names.
    local ipus = licensed_ipus(job_rec.licenses)
    if ipus ~= nil and ipus > 0 then
        job_desc.licenses = with_ipus(job_desc.licenses, ipus)
    end
    return slurm.SUCCESS
end

return slurm.SUCCESS
