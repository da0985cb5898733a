"""What ``vcgencmd pmic_read_adc`` prints on a Raspberry Pi 5, for the PMIC meter's fakes.

A verbatim capture with 4 busy cores, shared by the tests and the DVFS
benchmark so both parse exactly what a real board prints.
"""

PMIC_CAPTURE = """\
 3V7_WL_SW_A current(0)=0.09368929A
   3V3_SYS_A current(1)=0.08783370A
   1V8_SYS_A current(2)=0.18054710A
  DDR_VDD2_A current(3)=0.22543980A
  DDR_VDDQ_A current(4)=0.06666720A
   1V1_SYS_A current(5)=0.17566740A
    0V8_SW_A current(6)=0.37670900A
  VDD_CORE_A current(7)=6.22421000A
   3V3_DAC_A current(17)=0.00006105A
   3V3_ADC_A current(18)=0.00036630A
   0V8_AON_A current(16)=0.00305250A
      HDMI_A current(22)=0.02417580A
 3V7_WL_SW_V volt(8)=3.69977600V
   3V3_SYS_V volt(9)=3.31003300V
   1V8_SYS_V volt(10)=1.80512600V
  DDR_VDD2_V volt(11)=1.10476100V
  DDR_VDDQ_V volt(12)=0.60146460V
   1V1_SYS_V volt(13)=1.11025500V
    0V8_SW_V volt(14)=0.80146440V
  VDD_CORE_V volt(15)=0.86173300V
   3V3_DAC_V volt(20)=3.31318300V
   3V3_ADC_V volt(21)=3.30677300V
   0V8_AON_V volt(19)=0.80029220V
      HDMI_V volt(23)=5.08664000V
     EXT5V_V volt(24)=5.09066000V
      BATT_V volt(25)=0.00000000V
"""
