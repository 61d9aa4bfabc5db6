/*
 * vipu's SPANK plugin: the --ipus and --num-replicas options of sbatch, salloc and srun, and
 * the IPUoF environment of a job's tasks.
 *
 * At submission (allocator and local contexts) it checks the request against vipu.conf and
 * hands it to the controller-side programs through the job control environment
 * (SPANK_VIPU_IPUS, SPANK_VIPU_NUM_REPLICAS). `vipu-slurm prolog`, run as PrologSlurmctld,
 * creates the job's partition and writes its IPUoF files into IpuofDir; `vipu-slurm epilog`,
 * run as EpilogSlurmctld, removes them however the job ended. In the job's steps (remote
 * context) the plugin finds those files and sets IPUOF_CONFIG_PATH (each task its own GCD's
 * file), IPUOF_VIPU_API_HOST, IPUOF_VIPU_API_PORT and IPUOF_VIPU_API_PARTITION_ID.
 *
 * plugstack.conf:  required /path/to/vipu_spank.so [conf=/etc/slurm/vipu.conf]
 */

#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <slurm/spank.h>

SPANK_PLUGIN(vipu, 1);

#define DEFAULT_CONF "/etc/slurm/vipu.conf"
#define DEFAULT_PORT 8090
#define DEFAULT_MAX_IPUS 256

struct vipu_conf {
	char api_host[256];
	long api_port;
	char ipuof_dir[PATH_MAX - 128]; /* room left for the file names in it */
	long max_ipus;
};

static char conf_path[PATH_MAX] = DEFAULT_CONF;
static long requested_ipus;
static long requested_replicas;

/* A positive whole number, or -1. */
static long parse_count(const char *text)
{
	char *end;
	long value;

	if (text == NULL || *text == '\0')
		return -1;
	errno = 0;
	value = strtol(text, &end, 10);
	if (errno || *end != '\0' || value <= 0)
		return -1;
	return value;
}

static char *trim(char *text)
{
	char *end;

	while (*text == ' ' || *text == '\t')
		text++;
	end = text + strlen(text);
	while (end > text && (end[-1] == ' ' || end[-1] == '\t' || end[-1] == '\n' || end[-1] == '\r'))
		*--end = '\0';
	return text;
}

/* Read the keys the plugin needs; the controller-side programs check the whole file. */
static int read_conf(struct vipu_conf *conf)
{
	char line[PATH_MAX + 64];
	int number = 0;
	FILE *file = fopen(conf_path, "r");

	if (file == NULL) {
		slurm_error("vipu: cannot read %s: %s", conf_path, strerror(errno));
		return -1;
	}
	memset(conf, 0, sizeof(*conf));
	conf->api_port = DEFAULT_PORT;
	conf->max_ipus = DEFAULT_MAX_IPUS;
	while (fgets(line, sizeof(line), file) != NULL) {
		char *key, *value, *equals, *comment = strchr(line, '#');

		number++;
		if (comment != NULL)
			*comment = '\0';
		key = trim(line);
		if (*key == '\0')
			continue;
		equals = strchr(key, '=');
		if (equals == NULL) {
			slurm_error("vipu: %s line %d: expected Key=Value, found '%s'", conf_path, number, key);
			fclose(file);
			return -1;
		}
		*equals = '\0';
		key = trim(key);
		value = trim(equals + 1);
		if (strcasecmp(key, "ApiHost") == 0) {
			snprintf(conf->api_host, sizeof(conf->api_host), "%s", value);
		} else if (strcasecmp(key, "IpuofDir") == 0) {
			snprintf(conf->ipuof_dir, sizeof(conf->ipuof_dir), "%s", value);
		} else if (strcasecmp(key, "ApiPort") == 0 || strcasecmp(key, "MaxIpusPerJob") == 0) {
			long parsed = parse_count(value);

			if (parsed < 0) {
				slurm_error("vipu: %s line %d: %s must be a positive whole number, not '%s'", conf_path, number, key, value);
				fclose(file);
				return -1;
			}
			if (strcasecmp(key, "ApiPort") == 0)
				conf->api_port = parsed;
			else
				conf->max_ipus = parsed;
		}
	}
	fclose(file);
	if (conf->api_host[0] == '\0' || conf->ipuof_dir[0] == '\0') {
		slurm_error("vipu: %s must set ApiHost and IpuofDir", conf_path);
		return -1;
	}
	return 0;
}

static int on_ipus(int value, const char *optarg, int remote)
{
	long ipus = parse_count(optarg);

	(void)value;
	(void)remote;
	if (ipus < 0) {
		slurm_error("vipu: --ipus needs a positive whole number of IPUs, not '%s'", optarg ? optarg : "");
		return -1;
	}
	if (ipus & (ipus - 1)) {
		slurm_error("vipu: --ipus must be a power of two (1, 2, 4, 8, ...), not %ld", ipus);
		return -1;
	}
	requested_ipus = ipus;
	return 0;
}

static int on_replicas(int value, const char *optarg, int remote)
{
	long replicas = parse_count(optarg);

	(void)value;
	(void)remote;
	if (replicas < 0) {
		slurm_error("vipu: --num-replicas needs a positive whole number, not '%s'", optarg ? optarg : "");
		return -1;
	}
	requested_replicas = replicas;
	return 0;
}

/* Registered in every context: a static spank_options table reaches srun only, not sbatch or salloc. */
static struct spank_option options[] = {
	{"ipus", "N", "IPUs for the job's V-IPU partition (a power of two); -n gives its number of GCDs", 1, 0, on_ipus},
	{"num-replicas", "N", "Model replicas of the job's V-IPU partition", 1, 0, on_replicas},
	SPANK_OPTIONS_TABLE_END
};

int slurm_spank_init(spank_t sp, int ac, char **av)
{
	struct vipu_conf conf;
	int i;

	for (i = 0; i < ac; i++) {
		if (strncmp(av[i], "conf=", 5) == 0) {
			snprintf(conf_path, sizeof(conf_path), "%s", av[i] + 5);
		} else {
			slurm_error("vipu: unknown plugin argument '%s' in plugstack.conf (only conf=PATH)", av[i]);
			return -1;
		}
	}
	for (i = 0; options[i].name != NULL; i++) {
		if (spank_option_register(sp, &options[i]) != ESPANK_SUCCESS) {
			slurm_error("vipu: cannot register the --%s option", options[i].name);
			return -1;
		}
	}
	/* slurmd reads its plugins at start-up: say at once, in its log, if vipu.conf is unusable. */
	if (spank_context() == S_CTX_SLURMD)
		read_conf(&conf);
	return 0;
}

/* At submission: refuse what no partition can satisfy, and pass the request on to the prolog. */
int slurm_spank_init_post_opt(spank_t sp, int ac, char **av)
{
	struct vipu_conf conf;
	char text[32];
	spank_context_t context = spank_context();

	(void)ac;
	(void)av;
	if (context != S_CTX_LOCAL && context != S_CTX_ALLOCATOR)
		return 0;
	if (requested_ipus == 0) {
		if (requested_replicas) {
			slurm_error("vipu: --num-replicas needs --ipus");
			return -1;
		}
		return 0;
	}
	if (read_conf(&conf) != 0)
		return -1;
	if (requested_ipus > conf.max_ipus) {
		slurm_error("vipu: --ipus=%ld is more than the %ld IPUs a job may have (MaxIpusPerJob in %s)",
			    requested_ipus, conf.max_ipus, conf_path);
		return -1;
	}
	if (context == S_CTX_LOCAL && getenv("SLURM_JOB_ID") != NULL)
		return 0; /* a step of a job that already has its partition */
	snprintf(text, sizeof(text), "%ld", requested_ipus);
	if (spank_job_control_setenv(sp, "VIPU_IPUS", text, 1) != ESPANK_SUCCESS) {
		slurm_error("vipu: cannot pass --ipus to the job's prolog");
		return -1;
	}
	if (requested_replicas) {
		snprintf(text, sizeof(text), "%ld", requested_replicas);
		if (spank_job_control_setenv(sp, "VIPU_NUM_REPLICAS", text, 1) != ESPANK_SUCCESS) {
			slurm_error("vipu: cannot pass --num-replicas to the job's prolog");
			return -1;
		}
	}
	return 0;
}

/* The IPUoF file of GCD `gcd` of the job's partition, if the prolog wrote one; 0 if not. */
static int ipuof_file(const struct vipu_conf *conf, const char *partition, long gcd, char *path, size_t size)
{
	snprintf(path, size, "%s/%s_gcd%ld_ipuof.conf", conf->ipuof_dir, partition, gcd);
	if (access(path, R_OK) == 0)
		return 1;
	snprintf(path, size, "%s/%s_ipuof.conf", conf->ipuof_dir, partition);
	return gcd == 0 && access(path, R_OK) == 0;
}

/* In every task of the job's steps: where its partition is and which GCD is its own. */
int slurm_spank_task_init(spank_t sp, int ac, char **av)
{
	struct vipu_conf conf;
	uint32_t job_id = 0, task_id = 0;
	char partition[64], path[PATH_MAX], port[16];
	long gcds = 0;

	(void)ac;
	(void)av;
	if (spank_get_item(sp, S_JOB_ID, &job_id) != ESPANK_SUCCESS)
		return 0;
	snprintf(partition, sizeof(partition), "slurm-%u", job_id);
	if (read_conf(&conf) != 0)
		return requested_ipus ? -1 : 0;
	while (ipuof_file(&conf, partition, gcds, path, sizeof(path)) && gcds < 4096)
		gcds++;
	if (gcds == 0) {
		if (requested_ipus) {
			slurm_error("vipu: job %u asked for IPUs but %s holds no IPUoF file of partition %s",
				    job_id, conf.ipuof_dir, partition);
			return -1;
		}
		return 0;
	}
	spank_get_item(sp, S_TASK_GLOBAL_ID, &task_id);
	ipuof_file(&conf, partition, (long)(task_id % (uint32_t)gcds), path, sizeof(path));
	snprintf(port, sizeof(port), "%ld", conf.api_port);
	if (spank_setenv(sp, "IPUOF_CONFIG_PATH", path, 1) != ESPANK_SUCCESS ||
	    spank_setenv(sp, "IPUOF_VIPU_API_HOST", conf.api_host, 1) != ESPANK_SUCCESS ||
	    spank_setenv(sp, "IPUOF_VIPU_API_PORT", port, 1) != ESPANK_SUCCESS ||
	    spank_setenv(sp, "IPUOF_VIPU_API_PARTITION_ID", partition, 1) != ESPANK_SUCCESS) {
		slurm_error("vipu: cannot set the IPUoF environment of job %u", job_id);
		return -1;
	}
	return 0;
}
